#!/usr/bin/env python3
"""Time float32, bfloat16 and float16 GEMMs and attention on this CPU, with oneDNN capped at each
ISA level: the measurements behind the CPU dtype rule of src/core/cpu/cpuinfo.hpp.

LibTorch runs a bfloat16/float16 linear through oneDNN only where oneDNN has a code path for the
dtype on this CPU, else through a scalar fallback (at::native::cpublas::cpublas_gemm_impl).
oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) makes it behave as on an older CPU, so on
one AVX512-BF16 machine this measures what an AVX512-core CPU without BF16 (cap AVX512_CORE) and
an AVX2 + FMA CPU (cap AVX2) get. Each level runs in its own process (oneDNN reads the cap once);
within a process the dtypes alternate round by round, so the ratios hold on a busy machine.

    python benchmarks/cpu_dtype_probe.py [--caps ALL,AVX512_CORE,AVX2] [--json OUT]
        [--shape 3072x1024x1024] [--rounds 3] [--threads N]

The GEMM is the network's: [M tokens, K] x [K, N] with M = 3072 (1024x768 / 16^2), as a
torch.nn.functional.linear; attention is scaled_dot_product_attention at [1, 16, 3072, 64].
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

DTYPES = ("float32", "bfloat16", "float16")


def cpu_info() -> dict:
    """The CPU as result files record it: model name, the ISA flags that decide the dtypes,
    cores, load, and its identity (vendor, family, model, stepping, microarchitecture) from the
    benchmarks' shared machine_facts.py."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine_facts import machine_facts  # noqa: PLC0415

    facts = machine_facts()
    flags = set(facts["cpu"]["isa_flags"])
    keep = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
            "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "avx_ne_convert", "avx_vnni")
    ident = {k: facts["cpu"][k] for k in ("vendor", "family", "model", "stepping",
                                           "microarchitecture")}
    return {"cpu": facts["cpu"]["name"], "isa_flags": [f for f in keep if f in flags],
            "cores": facts["cores"], "loadavg": [f"{v:.2f}" for v in facts["load_average"]],
            "cpu_id": ident}


def busy_cpus(seconds: float = 1.0) -> float:
    """CPUs kept busy by everything on the machine over `seconds` (from /proc/stat)."""
    def sample():
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        idle = v[3] + v[4]
        return sum(v) - idle, sum(v)
    a = sample()
    time.sleep(seconds)
    b = sample()
    return (b[0] - a[0]) / max(b[1] - a[1], 1) * (os.cpu_count() or 1)


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    m, k, n = (int(v) for v in args.shape.split("x"))
    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(m, k, generator=g)
    w32 = torch.randn(n, k, generator=g) / k ** 0.5
    q32 = torch.randn(1, 16, 3072, 64, generator=g)
    kk32, v32 = torch.randn_like(q32), torch.randn_like(q32)
    ops = {}
    for name in DTYPES:
        dt = getattr(torch, name)
        x, w = x32.to(dt), w32.to(dt)
        q, kk, v = q32.to(dt), kk32.to(dt), v32.to(dt)
        ops[f"linear {name}"] = (lambda x=x, w=w: F.linear(x, w), 2.0 * m * k * n)
        ops[f"sdpa {name}"] = (lambda q=q, kk=kk, v=v: F.scaled_dot_product_attention(q, kk, v),
                               4.0 * 16 * 3072 * 3072 * 64)
    times: dict[str, list[float]] = {op: [] for op in ops}
    budget = args.max_seconds
    with torch.inference_mode():
        for name, (fn, _) in ops.items():  # warm-up (oneDNN builds its kernels)
            t0 = time.perf_counter()
            fn()
            if time.perf_counter() - t0 > budget:  # a scalar fallback: time it once, not more
                times[name].append(time.perf_counter() - t0)
        for _ in range(args.rounds):
            for name, (fn, _) in ops.items():
                if times[name] and times[name][0] > budget:
                    continue
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    out = {}
    for name, (_, flop) in ops.items():
        med = statistics.median(times[name])
        out[name] = {"ms": med * 1e3, "gflops": flop / med / 1e9, "samples": len(times[name])}
    for kind in ("linear", "sdpa"):
        ref = out[f"{kind} float32"]["ms"]
        for name in DTYPES[1:]:
            out[f"{kind} {name}"]["vs_float32"] = ref / out[f"{kind} {name}"]["ms"]
    print(json.dumps({"threads": torch.get_num_threads(), "results": out}))
    return 0


def onednn_version() -> str:
    import torch
    for line in torch.__config__.show().splitlines():
        if "oneDNN" in line or "MKL-DNN" in line:
            return line.strip().lstrip("- ")
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", default="ALL,AVX512_CORE,AVX2",
                    help="oneDNN ISA caps to measure (ALL: none)")
    ap.add_argument("--shape", default="3072x1024x1024", help="linear M x K x N")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=5.0,
                    help="an op slower than this is timed once (the scalar fallback)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    import torch

    report = {"meta": {"date": time.strftime("%Y-%m-%d"), **cpu_info(),
                       "busy_cpus_before": busy_cpus(), "torch": torch.__version__,
                       "onednn": onednn_version(), "python": platform.python_version(),
                       "shape": args.shape, "rounds": args.rounds,
                       "command": " ".join(["cpu_dtype_probe.py", *(argv or sys.argv[1:])])},
              "caps": {}}
    for cap in args.caps.split(","):
        env = {k: v for k, v in os.environ.items()
               if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
        if cap != "ALL":
            env["ONEDNN_MAX_CPU_ISA"] = cap
        cmd = [sys.executable, __file__, "--worker", "--shape", args.shape, "--rounds",
               str(args.rounds), "--threads", str(args.threads), "--max-seconds",
               str(args.max_seconds)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            report["caps"][cap] = {"error": r.stderr.strip()[-2000:]}
            continue
        report["caps"][cap] = json.loads(r.stdout.strip().splitlines()[-1])
        res = report["caps"][cap]["results"]
        line = ", ".join(f"{k} {v['ms']:.0f} ms" + (f" ({v['vs_float32']:.2f}x fp32)"
                                                    if "vs_float32" in v else "")
                         for k, v in res.items())
        print(f"cap {cap}: {line}", file=sys.stderr)
    report["meta"]["busy_cpus_after"] = busy_cpus()
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
