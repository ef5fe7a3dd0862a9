"""Sapiens2 end to end against the authors' pipeline on images of every size class.

The reference is the Sapiens2 demo's pipeline in Python: cv2.resize of the pinned opencv-python
wheel (INTER_AREA when the width shrinks, else INTER_CUBIC), BGR -> RGB, ImageNet mean/std, the
project's definition of the authors' module (tests/reference/sapiens2.py) in float32, bilinear
upsampling of the logits to the image size and argmax. The library (float32, CPU) must give
logits within 0.002 of it at the image size, on enlarged, shrunk and mixed images, through the
host and the device pipelines, and the same labels except where the reference's top two classes
are within float rounding of a tie.

It also shows the suite can tell resizes apart: the reference fed OpenCV's own cubic
(cv2.setUseOptimized(False), what Debian's OpenCV computes) is far outside the bar, and the
library with cubic="opencv" matches that reference instead.

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import FIXTURES, PKG_PARENT, use_oracles_and_tools
S2 = FIXTURES / "s2_tiny.safetensors"
if not S2.exists() or not any((PKG_PARENT / "sapiens_seg").glob("_core*")):
    pytest.skip(f"no s2_tiny fixture in {FIXTURES} or no extension in {PKG_PARENT}",
                allow_module_level=True)
sys.path.insert(0, str(PKG_PARENT))
use_oracles_and_tools()

from fixtures.sapiens2 import tiny_fixture  # noqa: E402
from reference import sapiens2 as s2  # noqa: E402

from sapiens_seg import segmentation  # noqa: E402

BAR = 0.002  # design section 6: CPU float32 vs the original
TIE = 1e-4   # labels may differ only where the reference's top-2 gap is this small

# (height, width): enlarged (INTER_CUBIC), shrunk (INTER_AREA), mixed, odd
IMAGES = {
    "enlarged 512x512": (512, 512),
    "enlarged 480x640": (480, 640),
    "enlarged portrait 640x360": (640, 360),
    "shrunk 1080x1920": (1080, 1920),
    "mixed: width shrinks, height grows 600x1000": (600, 1000),
    "mixed: width grows, height shrinks 1500x700": (1500, 700),
    "odd 333x517": (333, 517),
}


def photo_like(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth scene with edges and texture, BGR uint8 (as cv2.imread gives)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(2, 9), rng.uniform(2, 9), rng.uniform(0, 6.3)
        img[..., c] = 128 + 90 * np.sin(xx / w * fx + ph) * np.cos(yy / h * fy)
    for _ in range(6):  # a few solid shapes: edges the resizes treat differently
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        rw, rh = rng.integers(w // 10, w // 3), rng.integers(h // 10, h // 3)
        img[y0:y0 + rh, x0:x0 + rw] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def reference_model() -> s2.Sapiens2Seg:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    return s2.load_strict(S2, tiny_fixture().cfg)


def reference(model: s2.Sapiens2Seg, bgr: np.ndarray, optimized: bool = True):
    """The demo pipeline: logits [K, h, w] at the image size and the top-2 gap."""
    cv2.setUseOptimized(optimized)
    try:
        _, x = s2.demo_preprocess(bgr, 1024, 768)
    finally:
        cv2.setUseOptimized(True)
    with torch.no_grad():
        logits = model(x[None])
        up = F.interpolate(logits, size=bgr.shape[:2], mode="bilinear", align_corners=False)[0]
    top2 = up.topk(2, dim=0).values
    return up.numpy(), (top2[0] - top2[1]).numpy()


@pytest.fixture(scope="module")
def library_models():
    return {p: segmentation.load(str(S2), device="cpu", dtype="float32", pipeline=p, logits=True)
            for p in ("host", "device")}


@pytest.mark.parametrize("name", list(IMAGES))
def test_logits_and_labels_match_the_reference(name, reference_model, library_models):
    h, w = IMAGES[name]
    bgr = photo_like(h, w, seed=h * 31 + w)
    want, gap = reference(reference_model, bgr)
    rgb = np.ascontiguousarray(bgr[:, :, ::-1])
    for pipeline, model in library_models.items():
        r = model(rgb)
        diff = np.abs(r.logits - want)
        print(f"{name} ({pipeline}): max |logit diff| {diff.max():.2e}, mean {diff.mean():.2e}")
        assert diff.max() <= BAR, f"{name} ({pipeline}): max |diff| {diff.max()}"
        differ = r.labels != want.argmax(0)
        assert not np.any(differ & (gap > TIE)), (
            f"{name} ({pipeline}): {differ.sum()} labels differ, largest gap "
            f"{gap[differ].max() if differ.any() else 0}")


def test_the_suite_tells_opencvs_own_cubic_from_the_wheels(reference_model):
    """OpenCV's own cubic bytes (Debian's OpenCV, setUseOptimized(False)) move the logits far
    past the bar on an enlarged image, so a library resizing with them would fail the test
    above; cubic="opencv" reproduces that pipeline instead."""
    bgr = photo_like(480, 640, seed=5)
    want, _ = reference(reference_model, bgr, optimized=True)
    own, _ = reference(reference_model, bgr, optimized=False)
    assert np.abs(own - want).max() > 10 * BAR
    rgb = np.ascontiguousarray(bgr[:, :, ::-1])
    m = segmentation.load(str(S2), device="cpu", pipeline="host", logits=True, cubic="opencv")
    got = m(rgb).logits
    assert np.abs(got - own).max() <= BAR
    assert np.abs(got - want).max() > 10 * BAR
