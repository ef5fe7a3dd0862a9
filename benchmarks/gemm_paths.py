#!/usr/bin/env python3
"""Which library runs float32 GEMMs faster on this CPU: LibTorch's MKL or its oneDNN.

    python benchmarks/gemm_paths.py [--threads N] [--repeats R] [--json OUT]

LibTorch sends a float32 `linear`/`addmm` to MKL's sgemm. MKL picks its code path by CPU vendor:
on AMD cores it runs AVX2 code even where the core has full-width AVX-512, while oneDNN's JIT
(reached through `mkldnn::_linear_pointwise`, the op LibTorch's own compiler emits for CPU
linears) uses what CPUID reports on any vendor. This times both at the shapes the portable
network runs (Sapiens v1 0.3b and Sapiens2 0.4b at 1024x768: the backbone's linears, the v1 MLP's
1024-row chunks, a tile of the v1 head's 1x1 convolutions) and at 4096^3, and reports each
shape's rate and the FLOP-weighted ratio per network. The library's choice
(src/core/cpu/gemm.cpp, `SAPIENS_SEG_CPU_GEMM`) is a table of CPUs backed by files this writes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_facts import machine_facts  # noqa: E402

# (network, name, M, K, N): y[M, N] = x[M, K] W[N, K]^T + b, as the library calls them.
SHAPES = [
    ("v1-0.3b", "qkv", 3072, 1024, 3072),
    ("v1-0.3b", "proj", 3072, 1024, 1024),
    ("v1-0.3b", "fc1 (1024-row chunk)", 1024, 1024, 4096),
    ("v1-0.3b", "fc2 (1024-row chunk)", 1024, 4096, 1024),
    ("v1-0.3b", "head 1x1 conv (8192-pixel tile)", 8192, 768, 768),
    ("s2-0.4b", "wq / wo", 3081, 1024, 1024),
    ("s2-0.4b", "wk / wv (grouped-query layers)", 3081, 1024, 512),
    ("s2-0.4b", "w12", 3081, 1024, 8192),
    ("s2-0.4b", "w3", 3081, 4096, 1024),
    ("square", "4096^3", 4096, 4096, 4096),
]
# How often each shape runs per forward pass (v1 0.3b: 24 blocks; MLP chunks: 3 per block;
# Sapiens2 0.4b: 24 blocks, wq and wo each once, wk/wv twice in the 8 grouped layers and as wq's
# shape in the other 16, counted here as the grouped shape for simplicity of the weight).
WEIGHT = {"qkv": 24, "proj": 24, "fc1 (1024-row chunk)": 72, "fc2 (1024-row chunk)": 72,
          "head 1x1 conv (8192-pixel tile)": 72, "wq / wo": 48 + 32,
          "wk / wv (grouped-query layers)": 16, "w12": 24, "w3": 24, "4096^3": 1}


def median_time(fn, repeats: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    onednn = torch.ops.mkldnn._linear_pointwise
    torch.manual_seed(0)
    rows = []
    with torch.inference_mode():
        for net, name, M, K, N in SHAPES:
            x, w, b = torch.randn(M, K), torch.randn(N, K) / K**0.5, torch.randn(N)
            flop = 2.0 * M * K * N
            # Interleaved rounds, so a change in machine load hits both libraries alike.
            t_mkl, t_dnn = [], []
            for _ in range(3):
                t_mkl.append(median_time(lambda: torch.nn.functional.linear(x, w, b),
                                         args.repeats))
                t_dnn.append(median_time(lambda: onednn(x, w, b, "none", [], ""), args.repeats))
            mkl, dnn = min(t_mkl), min(t_dnn)
            diff = (torch.nn.functional.linear(x, w, b) - onednn(x, w, b, "none", [], "")).abs()
            rows.append({"network": net, "gemm": name, "m": M, "k": K, "n": N,
                         "mkl_gflops": flop / mkl / 1e9, "onednn_gflops": flop / dnn / 1e9,
                         "onednn_over_mkl": mkl / dnn, "max_abs_diff": float(diff.max())})
            r = rows[-1]
            print(f"{net:8} {name:34} {M:5}x{K:5}x{N:5}  MKL {r['mkl_gflops']:6.0f}  "
                  f"oneDNN {r['onednn_gflops']:6.0f} GFLOP/s  oneDNN/MKL {r['onednn_over_mkl']:.2f}x"
                  f"  max|diff| {r['max_abs_diff']:.1e}")
    summary = {}
    for net in ("v1-0.3b", "s2-0.4b"):
        sel = [r for r in rows if r["network"] == net]
        flop = sum(2.0 * r["m"] * r["k"] * r["n"] * WEIGHT[r["gemm"]] for r in sel)
        t_mkl = sum(2.0 * r["m"] * r["k"] * r["n"] * WEIGHT[r["gemm"]] / r["mkl_gflops"] for r in sel)
        t_dnn = sum(2.0 * r["m"] * r["k"] * r["n"] * WEIGHT[r["gemm"]] / r["onednn_gflops"]
                    for r in sel)
        summary[net] = {"gemm_gflop": flop / 1e9, "mkl_s": t_mkl / 1e9, "onednn_s": t_dnn / 1e9,
                        "onednn_over_mkl": t_mkl / t_dnn}
        print(f"{net}: the GEMMs above, weighted per forward pass: MKL {t_mkl / 1e9:.2f} s, "
              f"oneDNN {t_dnn / 1e9:.2f} s (oneDNN/MKL {t_mkl / t_dnn:.2f}x)")
    out = {"machine": machine_facts(), "threads": torch.get_num_threads(),
           "repeats": args.repeats, "shapes": rows, "per_network": summary}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
