#!/usr/bin/env python3
"""Soak tests: long runs that must keep memory flat and results exact.

    .venv/bin/python benchmarks/soak.py cli     [--images 10000] [--model FIXTURE] [--out JSON]
    .venv/bin/python benchmarks/soak.py threads [--threads 8] [--calls 1000] [--model FIXTURE]

``cli``: writes N images of mixed sizes and formats (JPEG, PNG, WebP; 1 in 100 corrupt: cut
short, garbage, empty) into a temporary folder, runs ``sapiens-seg segment`` on the folder in
one process and samples its resident memory (VmRSS) every 0.5 s. It checks that every input is
in summary.json exactly once (the corrupt ones as errors, the others with their outputs) and
reports the RSS curve: start (after the first 5 % of the inputs), middle, end and maximum.

``threads``: one model called from T Python threads, C calls each, on a fixed set of inputs
(paths, bytes and arrays of several sizes); every result must equal the serial result of the
same input. Reports mismatches, calls per second and the RSS curve.

Both append their figures to the JSON file given by --out, in the folder of the machine they ran
on (benchmarks/results/<machine>/soak.json, see benchmarks/results/README.md), with the date,
CPU, core count and versions. The "Long runs" figures of docs/performance.md come from these
runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SAPIENS_SEG_BUILD", REPO / "build"))
FIXTURES = Path(os.environ.get("SAPIENS_SEG_FIXTURES", BUILD / "fixtures"))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    """The /proc/cpuinfo ISA flags that matter for the numbers (vector widths, dot products)."""
    keep = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
            "avx512dq", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx512_vpopcntdq",
            "amx_bf16", "amx_fp16", "amx_int8")
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in keep if f in have]
    return []


def cpu_identity() -> dict:
    """Vendor, family, model, stepping and microarchitecture (machine_facts.py, shared by the
    benchmarks): one model name spans CPU generations."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine_facts import machine_facts

    return {k: v for k, v in machine_facts()["cpu"].items() if k != "isa_flags"}


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class Sampler(threading.Thread):
    """VmRSS of `pid` every `period` seconds, with a progress value from `progress()`."""

    def __init__(self, pid: int, progress, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.progress, self.period = pid, progress, period
        self.samples: list[tuple[float, int, float]] = []  # (seconds, progress, MB)
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            mb = rss_mb(self.pid)
            if mb is None:
                break
            self.samples.append((time.monotonic() - self.t0, self.progress(), mb))
            self.stop.wait(self.period)


def curve(samples: list[tuple[float, int, float]], total: int) -> dict:
    """RSS at 5 %, 50 % and 100 % of the work, and the maximum after the first 5 %."""
    def at(fraction: float) -> float:
        target = fraction * total
        best = min(samples, key=lambda s: abs(s[1] - target))
        return round(best[2], 1)

    warm = [s for s in samples if s[1] >= 0.05 * total] or samples
    return {"start_mb": at(0.05), "middle_mb": at(0.5), "end_mb": at(1.0),
            "max_after_start_mb": round(max(s[2] for s in warm), 1),
            "samples": len(samples),
            "curve": [[round(t, 1), p, round(m, 1)] for t, p, m in samples[:: max(1, len(samples) // 40)]]}


def versions() -> dict:
    sys.path.insert(0, str(BUILD / "python"))
    import cv2
    import torch

    import sapiens_seg

    return {"sapiens_seg": sapiens_seg.__version__, "torch": torch.__version__,
            "opencv_python": cv2.__version__, "python": platform.python_version()}


def make_images(folder: Path, n: int, seed: int = 0) -> tuple[int, int]:
    """n images, 1 in 100 corrupt. Returns (good, corrupt)."""
    import cv2

    rng = np.random.default_rng(seed)
    corrupt = 0
    templates = {}
    for i in range(n):
        h, w = int(rng.integers(32, 480)), int(rng.integers(32, 640))
        kind = ("jpg", "png", "webp")[i % 3]
        if i % 100 == 57:
            corrupt += 1
            mode = (i // 100) % 3
            path = folder / f"img_{i:05d}.{kind}"
            if mode == 0:
                ok, buf = cv2.imencode(".jpg", np.zeros((h, w, 3), np.uint8))
                path.with_suffix(".jpg").write_bytes(buf.tobytes()[: len(buf) // 2])
            elif mode == 1:
                path.write_bytes(rng.bytes(int(rng.integers(10, 5000))))
            else:
                path.write_bytes(b"")
            continue
        key = (h // 64, w // 64, kind)
        if key not in templates:  # a few hundred distinct images, reused: writing is fast
            img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
            cv2.ellipse(img, (w // 2, h // 2), (w // 3, h // 4), 0, 0, 360, (30, 180, 220), -1)
            ok, buf = cv2.imencode("." + kind, img)
            templates[key] = buf.tobytes()
        (folder / f"img_{i:05d}.{kind}").write_bytes(templates[key])
    return n - corrupt, corrupt


def soak_cli(args) -> dict:
    cli = BUILD / "bin" / "sapiens-seg"
    work = Path(tempfile.mkdtemp(prefix="sapiens_seg_soak_"))
    try:
        images, out = work / "in", work / "out"
        images.mkdir()
        good, corrupt = make_images(images, args.images)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
        cmd = [str(cli), "segment", str(images), "-o", str(out), "--model", str(args.model),
               "--json", "--save", args.save, "--batch-size", str(args.batch_size)]
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        done = [0]
        sampler = Sampler(p.pid, lambda: done[0])
        sampler.start()
        statuses: dict[str, int] = {}
        for line in p.stdout:
            entry = json.loads(line)
            statuses[entry["status"]] = statuses.get(entry["status"], 0) + 1
            done[0] += 1
        p.wait()
        seconds = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        summary = json.loads((out / "summary.json").read_text())
        inputs = [e["input"] for e in summary["images"]]
        assert len(inputs) == len(set(inputs)) == args.images, "an input is missing or repeated"
        assert statuses.get("error", 0) == corrupt and statuses.get("ok", 0) == good, statuses
        assert p.returncode == 17, p.returncode  # the corrupt inputs: invalid input
        leftovers = [f for f in out.iterdir() if ".tmp" in f.name]
        assert not leftovers, leftovers[:3]
        return {"kind": "cli", "images": args.images, "corrupt": corrupt, "model": Path(args.model).name,
                "save": args.save, "batch_size": args.batch_size, "seconds": round(seconds, 1),
                "images_per_second": round(args.images / seconds, 1), "exit_status": p.returncode,
                "rss": curve(sampler.samples, args.images)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def soak_threads(args) -> dict:
    sys.path.insert(0, str(BUILD / "python"))
    from concurrent.futures import ThreadPoolExecutor

    import cv2

    from sapiens_seg import segmentation

    model = segmentation.load(args.model, mode="portable", device="cpu")
    work = Path(tempfile.mkdtemp(prefix="sapiens_seg_soak_threads_"))
    try:
        rng = np.random.default_rng(3)
        inputs = []
        for k in range(12):
            h, w = int(rng.integers(32, 300)), int(rng.integers(32, 300))
            img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
            path = work / f"t{k}.png"
            cv2.imwrite(str(path), img)
            inputs.append((path, path.read_bytes(), img[:, :, ::-1].copy()))
        serial = [model(p).labels.copy() for p, _, _ in inputs]
        done = [0]
        sampler = Sampler(os.getpid(), lambda: done[0])
        sampler.start()
        lock = threading.Lock()

        def work_of(t: int) -> int:
            bad = 0
            for i in range(args.calls):
                k = (i * 7 + t) % len(inputs)
                x = inputs[k][(i + t) % 3]
                bad += not np.array_equal(model(x).labels, serial[k])
                with lock:
                    done[0] += 1
            return bad

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            mismatches = sum(pool.map(work_of, range(args.threads)))
        seconds = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        total = args.threads * args.calls
        return {"kind": "threads", "threads": args.threads, "calls_per_thread": args.calls,
                "model": Path(args.model).name, "mismatches": mismatches,
                "seconds": round(seconds, 1), "calls_per_second": round(total / seconds, 1),
                "rss": curve(sampler.samples, total)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cli", help="one CLI run over many images, RSS sampled")
    c.add_argument("--images", type=int, default=10000)
    c.add_argument("--save", default="labels,mask,json")
    c.add_argument("--batch-size", type=int, default=4)
    t = sub.add_parser("threads", help="T threads x C calls on one model, equal to serial")
    t.add_argument("--threads", type=int, default=8)
    t.add_argument("--calls", type=int, default=1000)
    for s in (c, t):
        s.add_argument("--model", default=str(FIXTURES / "tiny_a_torchscript.pt2"))
        # No default: a default folder would file another machine's figures under the first one.
        s.add_argument("--out", required=True,
                       help="benchmarks/results/<machine>/soak.json (appended to)")
    args = p.parse_args()
    result = soak_cli(args) if args.what == "cli" else soak_threads(args)
    result.update(date=dt.date.today().isoformat(), cpu=cpu_model(), cpu_flags=cpu_flags(),
                  cpu_id=cpu_identity(),
                  cores=os.cpu_count(),
                  **versions())
    out = Path(args.out)
    runs = json.loads(out.read_text()) if out.exists() else []
    runs.append(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(runs, indent=1) + "\n")
    shown = {k: v for k, v in result.items() if k != "rss"}
    shown["rss"] = {k: v for k, v in result["rss"].items() if k != "curve"}
    print(json.dumps(shown, indent=1))
    if result.get("mismatches"):
        sys.exit(1)


if __name__ == "__main__":
    main()
