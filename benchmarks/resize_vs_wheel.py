#!/usr/bin/env python3
"""The library's resizes against the opencv-python wheel's cv2.resize, from Python.

    .venv/bin/python benchmarks/resize_vs_wheel.py [--threads 1] [--reps 21] [--json OUT]

resize_bench (C++) compares with the OpenCV the build links (Debian's, no IPP); this compares
with what the authors' users run: the wheel (IPP's INTER_CUBIC and INTER_LINEAR where IPP takes
them). Both sides are called from Python on the same numpy images, alternating, with the same
thread count (cv2.setNumThreads, the library's intra-op threads through torch), so the binding's
overhead is inside the library's column. Each case also checks that the bytes are equal.
Prints median milliseconds and the ratio (library / wheel; below 1 is faster).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SAPIENS_SEG_BUILD", REPO / "build"))
sys.path.insert(0, str(BUILD / "python"))
sys.path.insert(0, str(REPO / "benchmarks"))

# (source h, w, target H, W, interpolation): the demos' resizes to the network input.
CASES = [
    (480, 640, 1024, 768, "linear"), (1080, 1920, 1024, 768, "linear"),
    (3000, 4000, 1024, 768, "linear"), (480, 640, 1024, 768, "cubic"),
    (512, 512, 1024, 768, "cubic"), (1500, 700, 1024, 768, "cubic"),
    (1080, 1920, 1024, 768, "area"), (3000, 4000, 1024, 768, "area"),
    (2048, 1536, 1024, 768, "area"),
]


def main() -> None:
    import cv2
    import torch

    import sapiens_seg
    from soak import cpu_flags, cpu_identity, cpu_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--json", default="")
    a = p.parse_args()
    cv2.setNumThreads(a.threads)
    torch.set_num_threads(a.threads)
    flag = {"linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA}
    rows = []
    print(f"{'resize':<28}{'library ms':>11}{'wheel ms':>10}{'ratio':>8}  bytes")
    for h, w, H, W, interp in CASES:
        img = np.random.default_rng(h * 31 + w).integers(0, 256, (h, w, 3), dtype=np.uint8)
        ours, theirs = [], []
        same = True
        for _ in range(a.reps):
            t0 = time.perf_counter()
            x = sapiens_seg.resize(img, (H, W), interp)
            t1 = time.perf_counter()
            y = cv2.resize(img, (W, H), interpolation=flag[interp])
            t2 = time.perf_counter()
            ours.append((t1 - t0) * 1e3)
            theirs.append((t2 - t1) * 1e3)
            same = same and np.array_equal(x, y)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        name = f"{h}x{w} -> {H}x{W} {interp}"
        print(f"{name:<28}{mo:>11.2f}{mt:>10.2f}{mo / mt:>7.2f}x  {'equal' if same else 'DIFFER'}")
        rows.append({"case": name, "library_ms": round(mo, 3), "wheel_ms": round(mt, 3),
                     "ratio": round(mo / mt, 3), "bytes_equal": same})
    if a.json:
        out = {"date": dt.date.today().isoformat(), "cpu": cpu_model(), "cpu_flags": cpu_flags(),
               "cpu_id": cpu_identity(),
               "cores": os.cpu_count(), "threads": a.threads, "reps": a.reps,
               "wheel_cubic_path": sapiens_seg.system_info().wheel_cubic_path,
               "opencv_python": cv2.__version__, "torch": torch.__version__,
               "python": platform.python_version(), "rows": rows}
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    if not all(r["bytes_equal"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
