"""The library's resizes against the opencv-python wheel the authors' users install, byte for byte.

``sapiens_seg.resize`` runs the library's own arithmetic (src/core/resize/): the host code, and
with ``device="cpu"`` the device pipeline's tensor code. Each is compared with ``cv2.resize`` of
the pinned wheel (tools/setup.sh) for INTER_LINEAR, INTER_AREA and INTER_CUBIC on many shapes:
enlarging, shrinking, mixed (one side up, the other down), odd sizes, integer factors (INTER_AREA's
block path, INTER_LINEAR's 2x shortcut), thin and large images, padded rows, crops and
channels-last views. With ``cv2.setUseOptimized(True)`` (the default: the wheel's INTER_CUBIC is
Intel IPP's) the reference is ``cubic="wheel"``; with ``setUseOptimized(False)`` (OpenCV's own
code) it is ``cubic="opencv"``.

Run through ctest (it sets SAPIENS_SEG_BUILD), or by hand:
    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_resize.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import REPO, PKG_PARENT, use_built_package

use_built_package()

from sapiens_seg import segmentation  # noqa: E402

REFERENCE_CV2 = "5.0.0"  # opencv-python-headless 5.0.0.93 (tools/setup.sh)

FLAGS = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "cubic": cv2.INTER_CUBIC}

# (source height, source width, output height, output width)
SHAPES = [
    # to the Sapiens input, enlarging
    (512, 512, 1024, 768), (480, 640, 1024, 768), (360, 640, 1024, 768), (720, 540, 1024, 768),
    (100, 75, 1024, 768), (37, 53, 1024, 768), (32, 32, 1024, 768), (1000, 700, 1024, 768),
    (1023, 767, 1024, 768), (256, 192, 1024, 768), (333, 517, 1024, 768), (97, 701, 1024, 768),
    # shrinking
    (1080, 1920, 1024, 768), (1920, 1080, 1024, 768), (3000, 4000, 1024, 768),
    (4000, 3000, 1024, 768), (1025, 769, 1024, 768), (1500, 2000, 1024, 768),
    (2048, 1536, 1024, 768), (3072, 2304, 1024, 768), (4096, 3072, 1024, 768),
    (2049, 1537, 1024, 768), (1111, 999, 1024, 768), (5000, 32, 1024, 768),
    # mixed: one side up, the other down
    (600, 1000, 1024, 768), (1500, 700, 1024, 768), (32, 5000, 1024, 768), (5000, 32, 768, 1024),
    (700, 1500, 1024, 768), (2000, 500, 1024, 768), (900, 800, 1024, 768), (1200, 600, 1024, 768),
    # other outputs (odd sizes, the row tails of the vector loops, tiny outputs)
    (480, 640, 333, 251), (480, 640, 1201, 301), (123, 457, 61, 77), (64, 48, 100, 71),
    (64, 48, 37, 29), (300, 211, 97, 1301), (1, 1, 16, 12), (2, 3, 1024, 768), (5, 7, 3, 2),
    (640, 480, 7, 5), (37, 1000, 1024, 768), (2000, 20, 1024, 768), (99, 101, 202, 51),
    (250, 384, 500, 768), (512, 384, 1024, 768), (768, 1024, 384, 512), (900, 1200, 300, 400),
    (401, 301, 100, 75), (1000, 1000, 250, 250), (1000, 1000, 333, 333), (777, 555, 1024, 768),
    (55, 66, 1024, 768), (2400, 1800, 1024, 768), (1536, 1152, 1024, 768), (613, 409, 1024, 768),
    (3000, 4000, 720, 1280), (1280, 720, 1024, 768), (960, 540, 1024, 768), (540, 960, 1024, 768),
]


def image(h: int, w: int, seed: int) -> np.ndarray:
    """Noise over a smooth pattern: every byte value, and many ties for the roundings."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([(xx * 255) // max(w - 1, 1), (yy * 255) // max(h - 1, 1),
                       ((xx + yy) * 7) % 256], -1).astype(np.uint8)
    return np.where(rng.random((h, w, 1)) < 0.5, noise, smooth)


@pytest.fixture(scope="module", autouse=True)
def reference_wheel():
    assert cv2.__version__ == REFERENCE_CV2, (
        f"the reference is opencv-python {REFERENCE_CV2}, found {cv2.__version__}")
    cv2.setUseOptimized(True)
    yield
    cv2.setUseOptimized(True)


def reference(img: np.ndarray, H: int, W: int, interp: str, optimized: bool) -> np.ndarray:
    cv2.setUseOptimized(optimized)
    try:
        return cv2.resize(img, (W, H), interpolation=FLAGS[interp])
    finally:
        cv2.setUseOptimized(True)


def mismatch(got: np.ndarray, want: np.ndarray) -> str:
    d = np.argwhere(got != want)
    return (f"{len(d)} of {want.size} bytes differ, max |diff| "
            f"{np.abs(got.astype(int) - want).max()}, first at {d[:3].tolist()}")


@pytest.mark.parametrize("optimized", [True, False], ids=["optimized", "unoptimized"])
@pytest.mark.parametrize("interp", ["linear", "area", "cubic"])
def test_host_and_tensor_paths_equal_cv2(interp: str, optimized: bool):
    cubic = "wheel" if optimized else "opencv"
    failures = []
    for i, (h, w, H, W) in enumerate(SHAPES):
        img = image(h, w, seed=i)
        want = reference(img, H, W, interp, optimized)
        for device in (None, "cpu"):
            got = segmentation.resize(img, (H, W), interp, cubic=cubic, device=device)
            if got.shape != want.shape or not np.array_equal(got, want):
                failures.append(f"{h}x{w} -> {H}x{W} ({'host' if device is None else 'tensor'}): "
                                + mismatch(got, want))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("interp", ["linear", "area", "cubic"])
def test_strided_views_and_natural_images(interp: str):
    """Padded rows, crops, channels-last views of CHW arrays and reversed axes: the library sees
    the same logical image as cv2, so the bytes are the same."""
    photo = cv2.imread(str(REPO / "examples" / "astronaut.jpg"))
    assert photo is not None
    base = image(700, 900, seed=99)
    views = {
        "photo": photo,
        "photo enlarged": cv2.resize(photo, (300, 200), interpolation=cv2.INTER_AREA),
        "crop": base[13:613, 27:827],
        "column step": base[:, ::2],
        "channels-last view": np.ascontiguousarray(base.transpose(2, 0, 1)).transpose(1, 2, 0),
        "reversed": base[::-1, ::-1],
        "padded rows": np.pad(base, ((0, 0), (0, 5), (0, 0)))[:, :900],
    }
    for name, v in views.items():
        for H, W in ((1024, 768), (333, 1111)):
            for optimized, cubic in ((True, "wheel"), (False, "opencv")):
                want = reference(np.ascontiguousarray(v), H, W, interp, optimized)
                for device in (None, "cpu"):
                    got = segmentation.resize(v, (H, W), interp, cubic=cubic, device=device)
                    assert np.array_equal(got, want), (
                        f"{name} {v.shape} -> {H}x{W} {cubic} {device}: " + mismatch(got, want))


def test_the_two_cubics_differ_and_the_wrong_one_is_caught():
    """The wheel's default cubic (IPP) and OpenCV's own differ on a few percent of the bytes; each
    flavour matches only its own reference, so the tests above can tell them apart."""
    img = image(480, 640, seed=7)
    wheel = reference(img, 1024, 768, "cubic", True)
    own = reference(img, 1024, 768, "cubic", False)
    share = np.mean(wheel != own)
    assert 0.005 < share < 0.2, share
    assert np.array_equal(segmentation.resize(img, (1024, 768), "cubic", cubic="wheel"), wheel)
    assert not np.array_equal(segmentation.resize(img, (1024, 768), "cubic", cubic="opencv"), wheel)


# Every IPP code path of the wheel on this one machine: OPENCV_IPP narrows the CPU features the
# wheel hands to IPP (the AVX-512 library without VPOPCNTDQ, the AVX2 and SSE4.2 libraries, no
# IPP), and the library honours the variable as OpenCV does (src/core/resize/wheel_cubic.cpp).
# Each runs in its own process, as the variable is read once.
_VARIANT_CHECK = r"""
import json, sys
import numpy as np, cv2
sys.path.insert(0, sys.argv[1])
from sapiens_seg import segmentation
sys.path.insert(0, sys.argv[2])
from test_resize import SHAPES, image, mismatch
bad = []
for i, (h, w, H, W) in enumerate(SHAPES[::3]):
    img = image(h, w, seed=1000 + i)
    want = cv2.resize(img, (W, H), interpolation=cv2.INTER_CUBIC)
    for device in (None, "cpu"):
        got = segmentation.resize(img, (H, W), "cubic", device=device)
        if not np.array_equal(got, want):
            bad.append(f"{h}x{w} -> {H}x{W} {device}: " + mismatch(got, want))
from sapiens_seg import system_info
print(json.dumps({"bad": bad, "path": system_info().wheel_cubic_path}))
"""


@pytest.mark.parametrize("opencv_ipp", ["avx512", "avx2", "sse42", "disabled"])
def test_cubic_on_each_of_the_wheels_ipp_paths(opencv_ipp: str):
    env = dict(os.environ, OPENCV_IPP=opencv_ipp)
    out = subprocess.run([sys.executable, "-c", _VARIANT_CHECK, str(PKG_PARENT),
                          str(Path(__file__).resolve().parent)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert not res["bad"], "\n".join(res["bad"])
    # system_info names the path it reproduces; OPENCV_IPP caps it as the wheel's own dispatch does.
    allowed = {"avx512": {"ipp-k0-skx", "ipp-l9"}, "avx2": {"ipp-l9"}, "sse42": {"ipp-y8"},
               "disabled": {"opencv"}}[opencv_ipp]
    assert res["path"] in allowed, res["path"]


def test_bad_arguments():
    img = image(40, 40, seed=1)
    with pytest.raises(ValueError, match="interpolation"):
        segmentation.resize(img, (10, 10), "nearest")
    with pytest.raises(ValueError, match="cubic"):
        segmentation.resize(img, (10, 10), "cubic", cubic="ipp")
    with pytest.raises(ValueError, match="size"):
        segmentation.resize(img, (0, 10))
    with pytest.raises(TypeError):
        segmentation.resize(img.astype(np.float32), (10, 10))
    with pytest.raises(TypeError, match="size"):
        segmentation.resize(img, 10)
