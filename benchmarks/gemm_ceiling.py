#!/usr/bin/env python3
"""The fastest a Sapiens forward pass can be on this CPU, from its FLOP count and the GEMM rate.

    python benchmarks/gemm_ceiling.py [--model FILE.pt2|FILE.safetensors] [--threads N] [--json OUT]

Counts the multiply-adds of the network from the checkpoint's tensor shapes (backbone linears and
attention at the training grid, 1024x768, the decoder head's sub-pixel deconvolutions and 1x1
convolutions; Sapiens v1 TorchScript files and Sapiens2 safetensors files, whose shapes are read
from the header alone), measures LibTorch's large square GEMM rate in float32 and bfloat16 on
this machine, and prints the time the forward pass would take if every FLOP ran at that rate. It
bounds what any implementation of the same arithmetic can reach, and so what speed-up over the
original is possible (the original's own time comes from speed_check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_facts import machine_facts  # noqa: E402


def network_gflop(state: dict[str, torch.Tensor]) -> dict[str, float]:
    pos = state["backbone.pos_embed"]
    tokens, C = pos.shape[1], pos.shape[2]
    depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("backbone.layers."))
    F = state["backbone.layers.0.ffn.layers.0.0.weight"].shape[0]
    linears = 2 * tokens * (3 * C * C + C * C + 2 * C * F)
    attention = 4 * tokens * tokens * C
    patch = state["backbone.patch_embed.projection.weight"]
    grid_h = round((tokens * 4 / 3) ** 0.5)
    grid_w = tokens // grid_h
    head = 0
    h, w = grid_h, grid_w
    for i in (0, 3, 6):  # k4 s2 transposed convolutions: 4 taps per output pixel
        wt = state[f"decode_head.deconv_layers.{i}.weight"]
        h, w = 2 * h, 2 * w
        head += 2 * h * w * 4 * wt.shape[0] * wt.shape[1]
    for i in (0, 3, 6):
        wt = state[f"decode_head.conv_layers.{i}.weight"]
        head += 2 * h * w * wt.shape[0] * wt.shape[1]
    seg = state["decode_head.conv_seg.weight"]
    head += 2 * h * w * seg.shape[0] * seg.shape[1]
    embed = 2 * tokens * C * patch[0].numel()
    return {"backbone": depth * (linears + attention) / 1e9, "embed": embed / 1e9,
            "head": head / 1e9}


def sapiens2_gflop(shapes: dict[str, list[int]], height: int = 1024,
                   width: int = 768) -> dict[str, float]:
    """Sapiens2 at one input size. Every 2-D block weight is a linear over all tokens (the
    grouped-query blocks' narrower k and v projections count as they are); attention's two
    products have the width of the queries."""
    patch = shapes["backbone.patch_embed.projection.weight"]
    grid_h, grid_w = height // patch[2], width // patch[3]
    extra = 1 + shapes.get("backbone.storage_tokens", [1, 0])[1]  # the class and storage tokens
    tokens = grid_h * grid_w + extra
    backbone = 0
    for key, shape in shapes.items():
        if key.startswith("backbone.blocks.") and key.endswith(".weight") and len(shape) == 2:
            backbone += 2 * tokens * shape[0] * shape[1]
            if key.endswith(".attn.wq.weight"):
                backbone += 4 * tokens * tokens * shape[0]
    head = 0
    h, w = grid_h, grid_w
    deconvs = sorted(int(k.split(".")[2]) for k in shapes
                     if k.startswith("decode_head.deconv_layers.") and k.endswith(".weight"))
    for i in deconvs:  # k4 s2 transposed convolutions: 4 taps per output pixel
        wt = shapes[f"decode_head.deconv_layers.{i}.weight"]
        h, w = 2 * h, 2 * w
        head += 2 * h * w * 4 * wt[0] * wt[1]
    for key, wt in shapes.items():
        if key.startswith(("decode_head.conv_layers.", "decode_head.conv_seg.")) and \
                key.endswith(".weight") and len(wt) == 4:
            head += 2 * h * w * wt[0] * wt[1] * wt[2] * wt[3]
    embed = 2 * grid_h * grid_w * patch[0] * patch[1] * patch[2] * patch[3]
    return {"backbone": backbone / 1e9, "embed": embed / 1e9, "head": head / 1e9}


def safetensors_shapes(path: str) -> dict[str, list[int]]:
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def gemm_gflops(dtype: torch.dtype, n: int = 4096, repeats: int = 5) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    with torch.inference_mode():
        a @ b
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        dt = (time.perf_counter() - t0) / repeats
    return 2 * n ** 3 / dt / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="build-bench/fixtures/full_0.3b_torchscript.pt2")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="GEMM dtypes to time (float32 alone on CPUs without bf16 dot products, "
                         "where LibTorch's bf16 GEMM is a scalar fallback taking minutes)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.model.endswith(".safetensors"):
        flops = sapiens2_gflop(safetensors_shapes(args.model))
    else:
        flops = network_gflop(torch.jit.load(args.model, map_location="cpu").state_dict())
    total = sum(flops.values())
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo")
                  if line.startswith("flags")), [])
    isa = [f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")]
    out = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cpu_isa_flags": isa,
           "cores": os.cpu_count(), "load_average": os.getloadavg(),
           "cpu_id": {k: v for k, v in machine_facts()["cpu"].items() if k != "isa_flags"},
           "model": args.model.rsplit("/", 1)[-1], "threads": torch.get_num_threads(),
           "torch": torch.__version__, "gflop": flops, "gflop_total": total, "gemm_gflops": {},
           "bound_ms": {}}
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    for name in args.dtypes.split(","):
        dtype = dtypes[name]
        rate = gemm_gflops(dtype)
        out["gemm_gflops"][name] = rate
        out["bound_ms"][name] = total / rate * 1e3
        print(f"{name}: 4096^3 GEMM {rate:.0f} GFLOP/s -> the network's {total:.0f} GFLOP take "
              f">= {total / rate:.1f} s")
    print(f"GFLOP: backbone {flops['backbone']:.0f}, head {flops['head']:.0f}, "
          f"patch embedding {flops['embed']:.1f}; {out['threads']} threads, torch {torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
