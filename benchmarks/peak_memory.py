#!/usr/bin/env python3
"""Peak memory of loading a checkpoint and segmenting one image, in a fresh process each.

For the big Sapiens2 files (5B: 20 GB of float32) the question is whether a machine of a given
size can run them at all. Each measurement is its own process; its peak RSS is the kernel's
(ru_maxrss of the finished child: VmHWM, file-backed pages of a mapped checkpoint included):

- `library <dtype>`: the sapiens-seg CLI, `segment IMAGE --model FILE --dtype <dtype>` (load,
  one call at the network's 1024x768 input, labels written): float32 uses the mapped file in
  place; bfloat16 converts each weight once and drops the file's pages behind it;
- `authors`: the authors' loading path, as their init_model does it: build the float32 module,
  safetensors `load_file` (a second full copy), `load_state_dict`, then one call
  (benchmarks/original_python.py's OriginalSapiens2). Where that would not fit in this machine's
  memory (estimated as 2 x the file plus the activations) it is not run; the estimate is recorded
  and, with --authors-model, the same path is measured on a smaller file of the family for the
  ratio of peak to file size.

    python benchmarks/peak_memory.py --model s2_full_5b.safetensors --cli build/bin/sapiens-seg \
        [--dtypes bfloat16,float32] [--authors-model s2_full_0.4b.safetensors] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def mem_total() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def mem_available() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run_child(cmd: list[str], env: dict | None = None) -> dict:
    """Runs cmd alone; its wall time, exit status and peak RSS in bytes (os.wait4's rusage of
    that one child, so runs do not mask each other)."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err.seek(0)
        tail = err.read().strip().splitlines()[-3:]
    return {"command": " ".join(Path(c).name if c.startswith("/") else c for c in cmd),
            "rc": p.returncode, "wall_s": wall, "peak_rss": ru.ru_maxrss * 1024,
            "stderr_tail": tail}


def synthetic_png(path: Path, h: int = 1024, w: int = 768) -> None:
    import cv2
    sys.path.insert(0, str(HERE))
    import original_python as op  # noqa: PLC0415

    cv2.imwrite(str(path), op.synthetic_rgb(h, w, 0)[:, :, ::-1])


def authors_cmd(model: Path) -> list[str]:
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import original_python as op, numpy as np\n"
            "p = op.OriginalSapiens2(%r, 'cpu')\n"
            "img = np.ascontiguousarray(op.synthetic_rgb(1024, 768, 0)[:, :, ::-1])\n"
            "p([img])\n") % (str(HERE), str(model))
    return [sys.executable, "-c", code]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--cli", required=True, type=Path, help="build/bin/sapiens-seg")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--authors-model", type=Path,
                    help="a smaller file of the same family for the authors' path's ratio")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    size = args.model.stat().st_size
    sys.path.insert(0, str(HERE))
    from cpu_dtype_probe import cpu_info  # noqa: PLC0415 - CPU model, ISA flags, cores

    import torch  # noqa: PLC0415

    report = {"meta": {"date": time.strftime("%Y-%m-%d"), **cpu_info(),
                       "versions": {"torch": torch.__version__,
                                    "sapiens-seg": subprocess.run(
                                        [str(args.cli), "--version"], capture_output=True,
                                        text=True, check=False).stdout.strip()},
                       "model_file": args.model.name,
                       "model_bytes": size, "mem_total": mem_total(),
                       "mem_available_at_start": mem_available(),
                       "loadavg": open("/proc/loadavg").read().split()[:3],
                       "command": " ".join(["peak_memory.py", *(argv or sys.argv[1:])])},
              "runs": {}}
    env = {k: v for k, v in os.environ.items()}
    env["SAPIENS_SEG_ALLOW_UNVERIFIED"] = "1"
    with tempfile.TemporaryDirectory(prefix="peak_memory_") as d:
        img = Path(d) / "synth_1024x768.png"
        synthetic_png(img)
        for dt in args.dtypes.split(","):
            cmd = [str(args.cli), "segment", str(img), "-o", str(Path(d) / dt), "--model",
                   str(args.model), "--dtype", dt, "--save", "labels", "--quiet"]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            print(f"peak_memory: library {dt} ...", file=sys.stderr, flush=True)
            report["runs"][f"library {dt}"] = run_child(cmd, env)
            print(f"  {report['runs'][f'library {dt}']['peak_rss'] / 2**30:.2f} GiB",
                  file=sys.stderr)
        # The authors' path: weights twice while loading, plus the activations (~1.5 GB at
        # 1024x768 for the 5B head and blocks, an estimate).
        estimate = 2 * size + int(1.5 * 2**30)
        report["authors_estimate_bytes"] = estimate
        if estimate < 0.9 * mem_available():
            print("peak_memory: authors' path ...", file=sys.stderr, flush=True)
            report["runs"]["authors"] = run_child(authors_cmd(args.model), env)
        else:
            report["runs"]["authors"] = {
                "not_run": f"2 x {size / 2**30:.1f} GiB + activations = "
                           f"{estimate / 2**30:.1f} GiB does not fit in this machine's "
                           f"{mem_available() / 2**30:.1f} GiB available"}
        if args.authors_model:
            small = args.authors_model
            r = run_child(authors_cmd(small), env)
            r["model_file"], r["model_bytes"] = small.name, small.stat().st_size
            r["peak_over_file"] = r["peak_rss"] / r["model_bytes"]
            report["runs"]["authors (smaller file)"] = r
            report["authors_extrapolated_bytes"] = int(r["peak_over_file"] * size)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
