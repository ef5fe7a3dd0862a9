#!/usr/bin/env python3
"""The CPU's float32 GEMM policies and head paths against each other, end to end, in one process.

    python benchmarks/cpu_policy_ab.py --model FILE [--size 1024x768] [--rounds 3] [--json OUT]
        [--variants mkl/gemm,...] [--vary SAPIENS_SEG_VARIABLE=value,value] [--dtype float32]

The library picks per CPU which library runs the float32 GEMMs (SAPIENS_SEG_CPU_GEMM: mkl,
split, onednn; src/core/cpu/gemm.hpp) and which path the decoder head takes
(SAPIENS_SEG_CPU_HEAD: gemm, onednn; SAPIENS_SEG_CPU_WINOGRAD: a head variant `onednn+wino`
runs the wide float32 deconvolutions by Winograd, `onednn` none). This loads the model once per
head path, then times whole calls with the GEMM policy switched call by call (the policy is read
at every forward pass), the variants interleaved round by round (every other round in the
reverse order) so that a change in the machine's load hits them alike. `--vary` crosses the
variants with the values of one more setting read at every call
(SAPIENS_SEG_CPU_MLP_COLUMNS=off,auto: Sapiens2's float32 MLP whole or by column chunks;
SAPIENS_SEG_CPU_ATTENTION=libtorch,auto: LibTorch's attention or the CPU's rule). `--dtype
bfloat16` runs the networks in bfloat16, whose GEMMs no policy moves (`split/mixed`, the head
path bfloat16 takes on AMX CPUs, with --vary is the A/B of one setting). The
network time (the library's own `timings["network"]`) is what the policies change; the call time
is what a user waits. Sapiens2 keeps MKL in its backbone under every policy (its bf16 RoPE needs
the authors' float32 rounding), so for Sapiens2 only the head and the MLP's chunking move.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_facts import machine_facts  # noqa: E402

POLICIES = ("mkl", "split", "onednn")
HEADS = ("gemm", "onednn", "mixed", "gemm+wino", "onednn+wino")
# Every policy with the two direct head paths; Winograd's variants are asked for by name.
DEFAULT_VARIANTS = ",".join(f"{p}/{h}" for h in HEADS[:2] for p in POLICIES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a .pt2 or .safetensors checkpoint")
    ap.add_argument("--size", default="1024x768", help="input HxW")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help="GEMM policy/head path pairs to time, e.g. mkl/gemm,split/onednn")
    ap.add_argument("--vary", help="SAPIENS_SEG_VARIABLE=v1,v2: a setting read per call, "
                    "crossed with the variants")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    pairs = [tuple(v.split("/")) for v in args.variants.split(",")]
    for p, hd in pairs:
        if p not in POLICIES or hd not in HEADS:
            ap.error(f"unknown variant {p}/{hd}")
    var, values = None, [None]
    if args.vary:
        var, _, vals = args.vary.partition("=")
        if not var.startswith("SAPIENS_SEG_") or not vals:
            ap.error("--vary takes SAPIENS_SEG_VARIABLE=value,value")
        values = vals.split(",")
    # (policy, head, value of the varied setting or None)
    variants = [(p, hd, v) for p, hd in pairs for v in values]

    def name(p: str, hd: str, v: str | None) -> str:
        return f"{p}/{hd}" + (f" {var}={v}" if v is not None else "")

    def apply(p: str, v: str | None) -> None:
        os.environ["SAPIENS_SEG_CPU_GEMM"] = p
        if var is not None:
            os.environ[var] = v
    from sapiens_seg import segmentation

    h, w = (int(v) for v in args.size.split("x"))
    image = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    models = {}
    for head in sorted({hd for _, hd, _ in variants}):
        os.environ["SAPIENS_SEG_CPU_HEAD"] = head.split("+")[0]
        os.environ["SAPIENS_SEG_CPU_WINOGRAD"] = "on" if head.endswith("+wino") else "off"
        t0 = time.perf_counter()
        models[head] = segmentation.load(args.model, mode="portable", device="cpu",
                                         dtype=args.dtype, accept_noncommercial=True)
        print(f"head {head}: loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    os.environ.pop("SAPIENS_SEG_CPU_HEAD")
    os.environ.pop("SAPIENS_SEG_CPU_WINOGRAD")
    calls: dict[str, list[float]] = {name(*v): [] for v in variants}
    network: dict[str, list[float]] = {k: [] for k in calls}
    for p, hd, v in variants:  # one warm-up call each
        apply(p, v)
        models[hd](image)
    for r in range(args.rounds):
        # Every other round in the reverse order, so that a drift within a round favours none.
        for p, hd, v in variants if r % 2 == 0 else variants[::-1]:
            apply(p, v)
            k = name(p, hd, v)
            t0 = time.perf_counter()
            res = models[hd](image)
            calls[k].append((time.perf_counter() - t0) * 1e3)
            network[k].append(res.timings["network"])
            print(f"round {r}: {k}: call {calls[k][-1]:8.0f} ms, "
                  f"network {network[k][-1]:8.0f} ms", flush=True)
    rows = {k: {"call_ms": statistics.median(v), "network_ms": statistics.median(network[k]),
                "calls_ms": v, "networks_ms": network[k]} for k, v in calls.items()}
    best = min(rows, key=lambda k: rows[k]["network_ms"])
    print("median network ms: " + ", ".join(f"{k} {v['network_ms']:.0f}" for k, v in rows.items())
          + f"; fastest {best}")
    if args.json:
        out = {"machine": machine_facts(), "model": Path(args.model).name, "size": args.size,
               "dtype": args.dtype,
               "rounds": args.rounds, "varied": var, "variants": rows, "fastest": best,
               "library_default": segmentation_default_line()}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def segmentation_default_line() -> str:
    import sapiens_seg

    os.environ.pop("SAPIENS_SEG_CPU_GEMM", None)
    return sapiens_seg.system_info().cpu_gemm


if __name__ == "__main__":
    sys.exit(main())
