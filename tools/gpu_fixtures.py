#!/usr/bin/env python3
"""Fixtures for the GPU checks (tools/gpu_check.sh), on a machine without OpenCV.

The GPU machine has PyTorch and NumPy but no cv2, which tools/make_fixtures.py uses only to
read, draw and resize images. This script builds the same fixtures with make_fixtures' own
model, TorchScript export and self-checks (tiny_b and wide_0.3b by default), and writes
reference outputs in make_fixtures' layout:

    <out>/<name>_torchscript.pt2
    <out>/ref/<name>/<stem>/{resized,input,logits,labels,top2_gap}.npy

for full_0.3b (the speed step's model: the real 0.3B shapes and key names, 24 blocks, random
weights) only the traced file, its keys and shapes checked against the spec template, without
make_fixtures' runs of the model or any reference output (a few seconds instead of minutes):

    <out>/full_0.3b_torchscript.pt2

and, for s2_tiny, the Sapiens2 weights file of tools/sapiens2_fixtures.py (the same model, seed
and file format; its GPU test computes the reference with the float32 portable network):

    <out>/s2_tiny.safetensors

for synthetic images drawn with NumPy directly at the network input size, each with the
"original" size its labels are upsampled to. The references run the saved file in float32 on
the CPU, as make_fixtures does.

Usage: python tools/gpu_fixtures.py --out DIR [--threads N]
                                   [--only tiny_b wide_0.3b s2_tiny full_0.3b]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import cv2  # noqa: F401  (make_fixtures imports it at module level)
except ImportError:
    # Only make_fixtures' image helpers use cv2, and this script calls none of them.
    sys.modules["cv2"] = types.ModuleType("cv2")
import make_fixtures as mf  # noqa: E402

# (stem, original height, original width, seed): a landscape photo-sized image and a tiny one,
# so the labels are both up- and down-sampled.
IMAGES = (("gpu_synth_1080x1920", 1080, 1920, 21), ("gpu_synth_33x47", 33, 47, 22))


def synthetic_bgr(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth background plus filled ellipses and rectangles, uint8 BGR [height, width, 3]."""
    rs = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rs.uniform(-1, 1), rs.uniform(-1, 1), rs.uniform(0, 2 * np.pi)
        img[..., c] = 128 + 60 * np.sin(a * yy / 90 + b * xx / 70 + p)
    for _ in range(12):
        cy, cx = rs.uniform(0, height), rs.uniform(0, width)
        ry, rx = rs.uniform(30, height / 3), rs.uniform(30, width / 3)
        color = rs.uniform(0, 255, size=3)
        if rs.rand() < 0.6:
            mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
        else:
            mask = (abs(yy - cy) <= ry / 2) & (abs(xx - cx) <= rx / 2)
        img[mask] = color
    return np.clip(img + rs.normal(0, 4, img.shape), 0, 255).astype(np.uint8)


def normalise(resized_bgr: np.ndarray) -> torch.Tensor:
    """BGR -> RGB, (x - mean) / std with the Sapiens-Lite demo values, as make_fixtures does."""
    t = torch.from_numpy(resized_bgr).permute(2, 0, 1)[[2, 1, 0]].float()
    mean = torch.tensor(mf.MEAN_LITE, dtype=torch.float32)
    std = torch.tensor(mf.STD_LITE, dtype=torch.float32)
    return (t - mean[:, None, None]) / std[:, None, None]


def write_references(cfg, model_path: Path, ref_dir: Path) -> None:
    model = torch.jit.load(str(model_path), map_location="cpu")
    for stem, h0, w0, seed in IMAGES:
        resized = synthetic_bgr(cfg.height, cfg.width, seed)
        t = normalise(resized)
        with torch.no_grad():
            logits = model(t[None])
            up = F.interpolate(logits, size=(h0, w0), mode="bilinear")
            top2 = up.topk(2, dim=1).values[0]
            labels = up.argmax(1)[0]
        gap = (top2[0] - top2[1]).numpy().astype(np.float32)
        lab = labels.numpy().astype(np.uint8)
        mf.save_arrays(ref_dir / stem, resized=resized, input=t.numpy().astype(np.float32),
                       logits=logits[0].numpy().astype(np.float32), labels=lab, top2_gap=gap)
        print(f"[{cfg.name}] ref {stem}: logits [{float(logits.min()):.2f}, "
              f"{float(logits.max()):.2f}], {np.unique(lab).size} labels, "
              f"near-ties {(gap < 1e-3).mean():.2%}", flush=True)


def build_speed_fixture(name: str, out_dir: Path) -> Path:
    """The traced file only: build, trace and save as make_fixtures does, then check the saved
    keys and shapes against the spec template. No eager-vs-loaded or batch checks (each is a
    full forward pass on the CPU) and no references: the speed step times the file, and the
    parity tests use the smaller fixtures."""
    cfg = mf.FIXTURES[name]
    model = mf.build_model(cfg)
    path = out_dir / cfg.file_name
    mf.trace_and_save(model, cfg, path)
    del model
    loaded = torch.jit.load(str(path), map_location="cpu")
    got, want = sorted(mf.module_entries(loaded)), sorted(mf.expected_entries(cfg))
    extra, missing = sorted(set(got) - set(want))[:4], sorted(set(want) - set(got))[:4]
    mf.check(got == want, f"{path.name}: keys or shapes differ from the spec template: "
             f"extra {extra}, missing {missing}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", nargs="+", default=["tiny_b", "wide_0.3b", "s2_tiny"],
                    choices=["tiny_b", "wide_0.3b", "s2_tiny", "full_0.3b"])
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default: all cores; tools/gpu_check.sh gives half, the "
                         "build runs beside it)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        t0 = time.time()
        if name == "s2_tiny":
            import sapiens2_fixtures as s2f  # after the cv2 stand-in above

            fx = s2f.tiny_fixture()
            path = args.out / f"{fx.name}.safetensors"
            s2f.save_st(s2f.state_dict_of(s2f.build_model(fx)), path)
            print(f"[{name}] written in {time.time() - t0:.1f}s ({path.stat().st_size} bytes)",
                  flush=True)
            continue
        if name == "full_0.3b":
            path = build_speed_fixture(name, args.out)
            print(f"[{name}] traced and key-checked in {time.time() - t0:.1f}s "
                  f"({path.stat().st_size / 1e9:.2f} GB)", flush=True)
            continue
        cfg, model, path, info = mf.build_fixture(name, args.out)
        del model
        print(f"[{name}] traced+verified in {time.time() - t0:.1f}s "
              f"(|logit| max {info['max_abs_logit']:.2f})", flush=True)
        write_references(cfg, path, args.out / "ref" / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
