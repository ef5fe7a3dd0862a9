#!/usr/bin/env python3
"""The CPU's float32 GEMM policies and head paths against each other, end to end, in one process.

    python benchmarks/cpu_policy_ab.py --model FILE [--size 1024x768] [--rounds 3] [--json OUT]

The library picks per CPU which library runs the float32 GEMMs (SAPIENS_SEG_CPU_GEMM: mkl,
split, onednn; src/core/cpu/gemm.hpp) and which path the decoder head takes
(SAPIENS_SEG_CPU_HEAD: gemm, onednn). This loads the model once per head path, then times whole
calls with the GEMM policy switched call by call (the policy is read at every forward pass), the
variants interleaved round by round so that a change in the machine's load hits them alike. The
network time (the library's own `timings["network"]`) is what the policies change; the call
time is what a user waits. Sapiens2 keeps MKL in its backbone under every policy (its bf16 RoPE
needs the authors' float32 rounding), so for Sapiens2 only the head moves.
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
HEADS = ("gemm", "onednn")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a .pt2 or .safetensors checkpoint")
    ap.add_argument("--size", default="1024x768", help="input HxW")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(f"{p}/{h}" for h in HEADS for p in POLICIES),
                    help="GEMM policy/head path pairs to time, e.g. mkl/gemm,split/onednn")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    variants = [tuple(v.split("/")) for v in args.variants.split(",")]
    for p, hd in variants:
        if p not in POLICIES or hd not in HEADS:
            ap.error(f"unknown variant {p}/{hd}")
    from sapiens_seg import segmentation

    h, w = (int(v) for v in args.size.split("x"))
    image = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    models = {}
    for head in sorted({hd for _, hd in variants}):
        os.environ["SAPIENS_SEG_CPU_HEAD"] = head
        t0 = time.perf_counter()
        models[head] = segmentation.load(args.model, mode="portable", device="cpu",
                                         dtype="float32", accept_noncommercial=True)
        print(f"head {head}: loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    os.environ.pop("SAPIENS_SEG_CPU_HEAD")
    calls: dict[str, list[float]] = {f"{p}/{hd}": [] for p, hd in variants}
    network: dict[str, list[float]] = {k: [] for k in calls}
    for p, hd in variants:  # one warm-up call each
        os.environ["SAPIENS_SEG_CPU_GEMM"] = p
        models[hd](image)
    for r in range(args.rounds):
        for p, hd in variants:
            os.environ["SAPIENS_SEG_CPU_GEMM"] = p
            t0 = time.perf_counter()
            res = models[hd](image)
            calls[f"{p}/{hd}"].append((time.perf_counter() - t0) * 1e3)
            network[f"{p}/{hd}"].append(res.timings["network"])
            print(f"round {r}: gemm {p:6} head {hd:6}: call {calls[f'{p}/{hd}'][-1]:8.0f} ms, "
                  f"network {network[f'{p}/{hd}'][-1]:8.0f} ms", flush=True)
    rows = {k: {"call_ms": statistics.median(v), "network_ms": statistics.median(network[k]),
                "calls_ms": v, "networks_ms": network[k]} for k, v in calls.items()}
    best = min(rows, key=lambda k: rows[k]["network_ms"])
    print("median network ms: " + ", ".join(f"{k} {v['network_ms']:.0f}" for k, v in rows.items())
          + f"; fastest {best}")
    if args.json:
        out = {"machine": machine_facts(), "model": Path(args.model).name, "size": args.size,
               "rounds": args.rounds, "variants": rows, "fastest": best,
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
