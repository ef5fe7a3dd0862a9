#!/usr/bin/env python3
"""Where the time goes, per kind of operation, in the library's portable network and in the
peers (ONNX Runtime, OpenVINO) on the same checkpoint and input: to see where one loses to the
other.

- portable: the Python binding (same process, same LibTorch) under torch.profiler; aten ops are
  grouped by kind (self CPU time, so nested ops are not counted twice);
- ONNX Runtime: its own per-node profile (SessionOptions.enable_profiling);
- OpenVINO: its per-layer performance counters (PERF_COUNT), for f32 and its default precision.

Each runtime runs `--calls` network calls after a warm-up; the breakdown is the mean per call, in
ms, by kind: linear (GEMMs of the blocks), attention (QK^T, softmax, AV, or a fused kernel),
norms (LayerNorm / RMSNorm / InstanceNorm), activations (GELU, SiLU), head convolutions
(deconvolutions and 1x1 convolutions), data movement (copies, reshapes, transposes, concat) and
the rest.

With --gemm-shapes, every GEMM shape of the portable network's blocks and head (aten::addmm,
aten::mm and oneDNN's mkldnn::_linear_pointwise, grouped by op and input shapes) is also run alone
on random data of the same shapes, dtype and threads, warm: `gemm_at_network_shapes` sets the
network's GEMM time beside that ceiling at its own shapes.

With --onednn-verbose CALLS (default 1), the portable columns run that many more calls under
oneDNN's verbose log, summed per primitive (kind, implementation, problem) into
`onednn_primitives`: what the profiler cannot split, such as the transposed convolutions inside
aten::_convolution's self time, and every reorder. --skip-peers profiles the portable columns
only (another build's profile beside a run that has the peers).

Each column runs in a process of its own (this script again, with --column), one after the
other: with the peers loaded beside it, the library's column ran 26 % slower on a 2-core Zen 3
(Sapiens2 0.4b float32: 32.0 s against 25.4 s alone, 2026-12-07), the runtimes' thread pools
competing. --same-process keeps every column in this one (as before that was found).

    python benchmarks/profile_peers.py --model FILE.pt2|.safetensors --onnx FILE.onnx \
        [--calls 3] [--threads N] [--dtypes float32,bfloat16] [--onednn-verbose 1] \
        [--skip-peers] [--same-process] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

KINDS = ("linear", "attention", "norm", "activation", "head conv", "data movement", "other")


def kind_of(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("attention", "softmax", "sdpa", "flash", "_efficient", "bmm",
                            "baddbmm")):
        return "attention"
    if any(k in n for k in ("convolution", "conv", "deconv", "mkldnn_convolution")):
        return "head conv"
    if any(k in n for k in ("matmul", "gemm", "linear", "addmm", "fullyconnected", "fusedmatmul",
                            "innerproduct", "mm")):
        return "linear"
    if any(k in n for k in ("norm", "rms", "reducemean", "mvn", "normalize")):
        return "norm"
    if any(k in n for k in ("gelu", "silu", "erf", "sigmoid", "swish", "tanh", "eltwise")):
        return "activation"
    if any(k in n for k in ("copy", "reshape", "transpose", "permute", "contiguous", "concat",
                            "cat", "cast", "convert", "reorder", "view", "gather", "slice",
                            "split", "expand", "clone", "empty", "to", "stack", "select")):
        return "data movement"
    return "other"


def example(h: int, w: int) -> np.ndarray:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 3, h, w, generator=g).numpy()


def onednn_primitives(log: str, calls: int) -> dict:
    """oneDNN's verbose lines (ONEDNN_VERBOSE=1) summed per primitive kind, implementation and
    problem: ms and calls per network call. Its transposed convolutions run inside
    aten::_convolution without an operator of their own, so the profiler shows them only as that
    op's self time; and each reorder (a weight or map re-laid out) shows here alone."""
    by: dict[str, dict] = {}
    for line in log.splitlines():
        f = line.split(",")
        if len(f) < 8 or not line.startswith("onednn_verbose") or f[3] != "exec":
            continue
        try:
            ms = float(f[-1])
        except ValueError:
            continue
        key = f"{f[5]} {f[6]} {f[-2]}"
        e = by.setdefault(key, {"calls": 0, "ms": 0.0})
        e["calls"] += 1
        e["ms"] += ms
    return {k: {"calls": v["calls"] / calls, "ms": v["ms"] / calls}
            for k, v in sorted(by.items(), key=lambda kv: -kv[1]["ms"])}


def _gemm_case(e, tdt, g):
    """(m, k, n, op, callable, gelu callable or None) for one GEMM event of the network, on random
    data of its shapes, or None for events that are not the network's GEMMs. The ops:

    - aten::addmm (bias [N], input [M, K], weight^T [K, N], an out= call as the network's): the
      blocks' linears on MKL, the CPU head's 1x1 convolutions. The weight is passed as the
      transpose of an [N, K] matrix, as the blocks' linears pass theirs; the head passes a
      contiguous [K, N] one, which the profiler's shapes cannot tell apart.
    - aten::mm ([M, K] @ [K, N], out=): the head's Winograd products and sub-pixel tap GEMMs.
    - mkldnn::_linear_pointwise (oneDNN's inner product, weight [N, K]): the plain overload run with
      no post-op, the binary one with its residual add. The profiler does not record the plain
      overload's post-op, so a GELU epilogue (v1's fc1) counts in the network's time and not in
      the alone one: its ratio is an upper bound of what the GEMM itself loses, and the same
      GEMM with GELU (the last callable) bounds what the epilogue costs.
    """
    shapes = e.input_shapes
    if e.key == "aten::addmm" and len(shapes) >= 3:
        bias, a, b = shapes[:3]
        if len(bias) != 1 or len(a) != 2 or len(b) != 2:
            return None
        (M, K), N = a, b[1]
        xa = torch.randn(M, K, generator=g).to(tdt)
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(tdt)
        bb = torch.randn(N, generator=g).to(tdt)
        out = torch.empty(M, N, dtype=tdt)
        return M, K, N, "addmm", lambda: torch.addmm(bb, xa, w.t(), out=out), None
    if e.key == "aten::mm" and len(shapes) >= 2:
        a, b = shapes[:2]
        if len(a) != 2 or len(b) != 2:
            return None
        (M, K), N = a, b[1]
        xa = torch.randn(M, K, generator=g).to(tdt)
        w = (torch.randn(K, N, generator=g) / K ** 0.5).to(tdt)
        out = torch.empty(M, N, dtype=tdt)
        return M, K, N, "mm", lambda: torch.mm(xa, w, out=out), None
    if e.key == "mkldnn::_linear_pointwise" and len(shapes) >= 3:
        binary = len(shapes) >= 4 and len(shapes[1]) == 2 and len(shapes[2]) == 2
        a, w_shape = (shapes[0], shapes[2]) if binary else (shapes[0], shapes[1])
        if len(a) != 2 or len(w_shape) != 2:
            return None
        (M, K), N = a, w_shape[0]
        xa = torch.randn(M, K, generator=g).to(tdt)
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(tdt)
        bb = torch.randn(N, generator=g).to(tdt)
        op = torch.ops.mkldnn._linear_pointwise
        if binary:
            other = torch.randn(M, N, generator=g).to(tdt)
            return M, K, N, "onednn+add", lambda: op.binary(xa, other, w, bb, "add"), None
        return (M, K, N, "onednn", lambda: op(xa, w, bb, "none", [], ""),
                lambda: op(xa, w, bb, "gelu", [], "none"))
    return None


def gemm_at_network_shapes(events, calls: int, dtype: str, repeats: int = 5) -> dict:
    """Each GEMM shape of the network's calls (grouped by op and input shapes; `_gemm_case` lists
    the ops), run alone on the same shapes, dtype and threads, warm, the median of `repeats`. The
    network's GEMM time against this ceiling at its own shapes says how much of the GEMM time is
    the GEMM itself and how much is what the network's surroundings cost it (cold caches, page
    state, other threads)."""
    from gemm_paths import median_time  # noqa: PLC0415  (this folder's GEMM timer)

    tdt = getattr(torch, dtype)
    rows, net_total, alone_total = [], 0.0, 0.0
    g = torch.Generator().manual_seed(0)
    for e in events:
        with torch.inference_mode():
            case = _gemm_case(e, tdt, g)
            if case is None:
                continue
            M, K, N, op, fn, gelu_fn = case
            alone_ms = median_time(fn, repeats) * 1e3
            gelu_ms = median_time(gelu_fn, repeats) * 1e3 if gelu_fn else None
        n = e.count / calls
        net_ms = e.self_cpu_time_total / 1e3 / e.count
        row = {"op": op, "m": M, "k": K, "n": N, "calls_per_forward": n,
               "network_ms": net_ms, "alone_ms": alone_ms,
               "network_over_alone": net_ms / alone_ms,
               "gflops_alone": 2 * M * K * N / alone_ms / 1e6}
        if gelu_ms is not None:
            row["alone_with_gelu_ms"] = gelu_ms
        rows.append(row)
        net_total += n * net_ms
        alone_total += n * alone_ms
    return {"shapes": rows, "network_ms": net_total, "alone_ms": alone_total,
            "network_over_alone": net_total / alone_total if alone_total else None}


def profile_portable(model: str, x: np.ndarray, calls: int, dtype: str,
                     verbose_calls: int = 0,
                     gemm_shapes: bool = False) -> tuple[dict, dict, dict]:
    """ATen self time per op (ms per call), oneDNN's primitives, and the extras: the unprofiled
    wall time per call and, with gemm_shapes, gemm_at_network_shapes."""
    import sapiens_seg  # noqa: PLC0415
    from sapiens_seg import segmentation  # noqa: PLC0415

    m = segmentation.load(model, mode="portable", device="cpu", dtype=dtype,
                          allow_unverified=True, accept_noncommercial=True)
    # raw network: an image of the network's input size, no resize; the profile still shows the
    # pre/post ops, which are reported apart under "other" (upsample, argmax).
    h, w = x.shape[2:]
    img = (np.clip(x[0].transpose(1, 2, 0) * 50 + 128, 0, 255)).astype(np.uint8)
    m(img)  # warm-up
    # The same calls unprofiled: the wall time holds what the profiler does not see as ATen ops
    # (the library's own fused loops, resize, argmax), so total - ATen total is their share.
    t0 = time.perf_counter()
    for _ in range(calls):
        m(img)
    wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=gemm_shapes) as prof:
        for _ in range(calls):
            m(img)
    by = collections.Counter()
    for e in prof.key_averages():
        if e.key.startswith("aten::") or e.key.startswith("mkldnn"):
            by[e.key] += e.self_cpu_time_total / 1e3 / calls
    primitives: dict = {}
    extras: dict = {"wall_ms": wall_ms}
    if gemm_shapes:
        extras["gemm_at_network_shapes"] = gemm_at_network_shapes(
            prof.key_averages(group_by_input_shape=True), calls, dtype)
    if verbose_calls:
        # oneDNN prints its verbose lines on the process's stdout (file descriptor 1): caught in a
        # file for these calls only.
        import tempfile  # noqa: PLC0415

        sys.stdout.flush()
        with tempfile.TemporaryFile(mode="w+") as cap:
            saved = os.dup(1)
            os.dup2(cap.fileno(), 1)
            try:
                with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                    for _ in range(verbose_calls):
                        m(img)
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
            cap.seek(0)
            primitives = onednn_primitives(cap.read(), verbose_calls)
    del sapiens_seg
    return dict(by), primitives, extras


def profile_ort(onnx: str, x: np.ndarray, calls: int, threads: int, tmp: str) -> dict:
    import onnxruntime as ort  # noqa: PLC0415

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tmp, "ort_profile")
    sess = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    sess.run(None, {name: x})
    path = sess.end_profiling()
    so.enable_profiling = True
    sess = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    sess.run(None, {name: x})  # warm-up
    for _ in range(calls):
        sess.run(None, {name: x})
    path = sess.end_profiling()
    events = json.load(open(path))
    per_run = collections.Counter()
    runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", e["name"])
            per_run[op] += e["dur"] / 1e3
    runs = max(runs, 1)
    return {k: v / runs for k, v in per_run.items()}


def profile_ov(onnx: str, x: np.ndarray, calls: int, threads: int, precision: str | None) -> dict:
    import openvino as ov  # noqa: PLC0415

    core = ov.Core()
    cfg = {"PERF_COUNT": True, "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        cfg["INFERENCE_PRECISION_HINT"] = precision
    compiled = core.compile_model(onnx, "CPU", cfg)
    req = compiled.create_infer_request()
    req.infer({0: x})
    by = collections.Counter()
    for _ in range(calls):
        req.infer({0: x})
        for p in req.get_profiling_info():
            by[p.node_type + " " + p.exec_type] += p.real_time.total_seconds() * 1e3
    return {k: v / calls for k, v in by.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtypes", default="float32", help="portable dtypes to profile")
    ap.add_argument("--onednn-verbose", type=int, default=1, metavar="CALLS",
                    help="portable calls run once more with oneDNN's verbose log, summed per "
                         "primitive into `onednn_primitives` (0: none)")
    ap.add_argument("--skip-peers", action="store_true",
                    help="the portable columns only (a second build's profile beside a run that "
                         "has the peers)")
    ap.add_argument("--gemm-shapes", action="store_true",
                    help="time every GEMM shape (addmm, mm, oneDNN linear) of the portable "
                         "network alone as well "
                         "(`gemm_at_network_shapes`: the GEMM ceiling at the network's shapes)")
    ap.add_argument("--same-process", action="store_true",
                    help="every column in this process (default: a process per column)")
    ap.add_argument("--column", help=argparse.SUPPRESS)  # a child's one column
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    import onnx as onnx_pkg  # noqa: PLC0415

    shape = [d.dim_value for d in
             onnx_pkg.load(args.onnx, load_external_data=False).graph.input[0].type.tensor_type
             .shape.dim]
    x = example(shape[2], shape[3])
    import tempfile  # noqa: PLC0415

    from cpu_dtype_probe import cpu_info  # noqa: PLC0415  (this folder's probe)
    from machine_facts import machine_facts  # noqa: PLC0415
    import onnxruntime  # noqa: PLC0415
    import openvino  # noqa: PLC0415

    out = {"meta": {"date": time.strftime("%Y-%m-%d"), "model": os.path.basename(args.model),
                    "threads": threads, "calls": args.calls, **cpu_info(),
                    "versions": {"torch": torch.__version__,
                                 "onnxruntime": onnxruntime.__version__,
                                 "openvino": openvino.__version__},
                    "command": " ".join(["profile_peers.py"] + sys.argv[1:])},
           "ms_per_call": {}}
    out["meta"]["machine"] = machine_facts()
    out["meta"]["loadavg_before"] = list(os.getloadavg())
    prims = {}
    columns = [f"portable {dt}" for dt in args.dtypes.split(",")]
    if not args.skip_peers:
        columns += ["onnxruntime", "openvino f32", "openvino default"]
    if args.column:
        columns = [args.column]
    out["meta"]["processes"] = "one" if args.same_process else "one per column"
    with tempfile.TemporaryDirectory() as tmp:
        for col in columns:
            if not (args.same_process or args.column):
                child = run_column(argv, col, tmp)
                for key in ("ms_per_call", "wall_ms_per_call", "gemm_at_network_shapes"):
                    if col in child.get(key, {}):
                        out.setdefault(key, {})[col] = child[key][col]
                prims[col] = child.get("onednn_primitives", {}).get(col, {})
            elif col.startswith("portable "):
                out["ms_per_call"][col], prims[col], extras = profile_portable(
                    args.model, x, args.calls, col.split()[1], args.onednn_verbose,
                    args.gemm_shapes)
                out.setdefault("wall_ms_per_call", {})[col] = extras["wall_ms"]
                if "gemm_at_network_shapes" in extras:
                    out.setdefault("gemm_at_network_shapes", {})[col] = (
                        extras["gemm_at_network_shapes"])
            elif col == "onnxruntime":
                out["ms_per_call"][col] = profile_ort(args.onnx, x, args.calls, threads, tmp)
            else:
                out["ms_per_call"][col] = profile_ov(args.onnx, x, args.calls, threads,
                                                     "f32" if col == "openvino f32" else None)
    if args.column:  # a child: its column as measured, for the parent to merge
        out["onednn_primitives"] = {k: v for k, v in prims.items() if v}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f)
        return 0
    out["meta"]["loadavg_after"] = list(os.getloadavg())
    # Per op name -> per kind.
    out["by_op"] = out.pop("ms_per_call")
    out["ms_per_call"] = {}
    for col, ops in out["by_op"].items():
        kinds = collections.Counter()
        for op, ms in ops.items():
            kinds[kind_of(op)] += ms
        out["ms_per_call"][col] = dict(kinds)
    cols = list(out["ms_per_call"])
    print("| kind | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for k in KINDS + ("total",):
        cells = []
        for c in cols:
            d = out["ms_per_call"][c]
            v = sum(d.values()) if k == "total" else d.get(k, 0.0)
            cells.append(f"{v:.0f}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    for col, ms in out.get("wall_ms_per_call", {}).items():
        print(f"{col}: {ms:.0f} ms per call unprofiled (the ATen total above leaves out the "
              f"library's own loops)")
    for col, g in out.get("gemm_at_network_shapes", {}).items():
        print(f"{col}: GEMMs {g['network_ms']:.0f} ms per call in the network, "
              f"{g['alone_ms']:.0f} ms alone at the same shapes "
              f"({g['network_over_alone']:.3f}x)")
    if any(prims.values()):
        out["onednn_primitives"] = {k: v for k, v in prims.items() if v}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return 0


def run_column(argv: list[str], column: str, tmp: str) -> dict:
    """This script again on one column, in a fresh process; its raw (per op name) result."""
    rest, skip = [], False
    for a in argv:  # the parent's flags, less --json and its value
        if skip:
            skip = False
        elif a == "--json":
            skip = True
        elif not a.startswith("--json="):
            rest.append(a)
    path = os.path.join(tmp, f"column-{len(os.listdir(tmp))}.json")
    print(f"profile_peers: {column} in its own process ...", flush=True)
    subprocess.run([sys.executable, os.path.abspath(__file__), *rest, "--column", column,
                    "--json", path], check=True)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    sys.exit(main())
