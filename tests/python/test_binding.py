"""The Python binding (sapiens_seg): inputs, results, errors, threads, parity with the C++ CLI
and the authors' recipe, memory over many calls, and ``python -m sapiens_seg``.

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES), or by hand:

    SAPIENS_SEG_BUILD=$PWD/build SAPIENS_SEG_FIXTURES=$PWD/build/fixtures \\
        .venv/bin/python -m pytest -q tests/python/test_binding.py

The package is imported from <build>/python (where the CMake build assembles it); the suite is
skipped only when the extension is not built there.
"""

from __future__ import annotations

import gc
import os
import pathlib
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, FIXTURES, PKG_PARENT, CLI, use_built_package

use_built_package()


import cv2  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import sapiens_seg  # noqa: E402
from sapiens_seg import segmentation  # noqa: E402
from sapiens_seg import (  # noqa: E402
    BackendUnavailableError,
    CheckpointFormatError,
    ChecksumError,
    DownloadError,
    ErrorCode,
    InternalError,
    InvalidInputError,
    LicenseNotAcceptedError,
    OfflineError,
    OutOfMemoryError,
    SapiensIOError,
    SapiensSegError,
    WeightsNotFoundError,
)

TINY_A = FIXTURES / "tiny_a_torchscript.pt2"
TINY_B = FIXTURES / "tiny_b_torchscript.pt2"
IMAGES = FIXTURES / "images"
PNG = IMAGES / "synth_300x211.png"  # lossless: every decoder agrees on its pixels
SMALL = IMAGES / "synth_33x47.png"
EXAMPLE = REPO / "examples" / "astronaut.jpg"
REF_STEMS = sorted(p.name for p in (FIXTURES / "ref" / "tiny_a").iterdir()
                   if (p / "labels.npy").exists()) if (FIXTURES / "ref" / "tiny_a").is_dir() else []

pytestmark = pytest.mark.skipif(not TINY_A.exists(), reason=f"no fixtures in {FIXTURES}")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def model():
    # One intra-op thread (process-wide): keeps the suite fast and steady on a busy 2-core box,
    # where LibTorch's spinning pool otherwise slows each call by an order of magnitude.
    return segmentation.load(TINY_A, mode="portable", device="cpu", threads=1)


@pytest.fixture(scope="module")
def png_rgb():
    return cv2.imread(str(PNG), cv2.IMREAD_COLOR)[:, :, ::-1]  # BGR -> RGB, a negative stride


# ---- import, version, package files ---------------------------------------------------------

def test_package_comes_from_this_build_and_has_version_stubs_and_marker():
    pkg = Path(sapiens_seg.__file__).resolve().parent
    assert pkg == (PKG_PARENT / "sapiens_seg").resolve()
    assert sapiens_seg.__version__ == sapiens_seg._core.version()
    assert sapiens_seg.__version__.count(".") == 2
    assert (pkg / "py.typed").exists() and (pkg / "_core.pyi").exists()
    r = subprocess.run([str(CLI), "--version"], capture_output=True, text=True, timeout=60)
    assert sapiens_seg.__version__ in r.stdout


def test_docstrings_say_what_is_thread_safe_and_show_examples():
    for obj in (segmentation, segmentation.Model):
        assert "thread" in obj.__doc__.lower() and "Example" in obj.__doc__
    assert "Example" in segmentation.load.__doc__ and "Example" in segmentation.Result.__doc__


# ---- inputs -----------------------------------------------------------------------------------

def test_every_input_type_gives_the_same_labels(model, png_rgb):
    ref = model(str(PNG)).labels
    assert ref.shape == (300, 211) and ref.dtype == np.uint8
    contiguous = np.ascontiguousarray(png_rgb)
    padded = np.zeros((300, 250, 3), np.uint8)
    padded[:, :211] = contiguous
    pil = Image.open(PNG)
    inputs = {
        "str": str(PNG),
        "pathlib.Path": pathlib.Path(PNG),
        "bytes": PNG.read_bytes(),
        "bytearray": bytearray(PNG.read_bytes()),
        "memoryview": memoryview(PNG.read_bytes()),
        "numpy (negative stride)": png_rgb,
        "numpy (contiguous)": contiguous,
        "numpy (padded rows, no copy)": padded[:, :211],
        "numpy (Fortran order)": np.asfortranarray(contiguous),
        "numpy (read-only)": np.frombuffer(contiguous.tobytes(), np.uint8).reshape(300, 211, 3),
        "PIL (RGB)": pil.convert("RGB"),
        "PIL (RGBA, converted)": pil.convert("RGBA"),
        "torch": torch.from_numpy(contiguous),
        "torch (non-contiguous)": torch.from_numpy(contiguous).permute(2, 0, 1).permute(1, 2, 0),
        "read_image": segmentation.read_image(PNG),
    }
    for name, x in inputs.items():
        r = model(x)
        assert np.array_equal(r.labels, ref), name
    assert np.array_equal(segmentation.read_image(PNG), contiguous)
    assert np.array_equal(segmentation.read_image(PNG.read_bytes()), contiguous)


def test_a_list_returns_a_list_equal_to_single_calls(model, png_rgb):
    xs = [str(PNG), png_rgb, EXAMPLE.read_bytes(), Image.open(SMALL)]
    singles = [model(x).labels for x in xs]
    results = model(xs)
    assert isinstance(results, list) and len(results) == 4
    assert [r.labels.shape for r in results] == [(300, 211), (300, 211), (512, 512), (33, 47)]
    for r, s in zip(results, singles):
        assert np.array_equal(r.labels, s)
    assert isinstance(model(tuple(xs[:2])), list)
    assert model([]) == []
    one = model([PNG])
    assert isinstance(one, list) and np.array_equal(one[0].labels, singles[0])


# ---- results ----------------------------------------------------------------------------------

def test_result_fields(model):
    r = model(PNG)
    assert r.labels.shape == (300, 211) and r.labels.dtype == np.uint8
    assert (r.height, r.width) == (300, 211)
    # Zero-copy: a read-only view of the library's buffer, the same memory every time.
    assert not r.labels.flags.owndata and not r.labels.flags.writeable
    addr = r.labels.__array_interface__["data"][0]
    assert r._native.labels.__array_interface__["data"][0] == addr
    assert r.logits is None
    assert r.foreground.dtype == np.bool_ and np.array_equal(r.foreground, r.labels > 0)
    assert r.classes[0] == "Background" and len(r.classes) == 28
    assert all(isinstance(c, str) for c in r.classes)
    assert r.palette.shape == (28, 3) and r.palette.dtype == np.uint8
    assert tuple(r.palette[0]) == (50, 50, 50)
    assert r.backend == segmentation.Backend(mode="portable", device="cpu", dtype="float32")
    assert r.backend == ("portable", "cpu", "float32") and r.backend.mode == "portable"
    assert repr(r.backend) == "Backend(mode='portable', device='cpu', dtype='float32')"
    assert set(r.timings) == {"decode", "preprocess", "network", "postprocess", "total"}
    assert all(isinstance(v, float) and v >= 0 for v in r.timings.values())
    assert r.timings["total"] >= r.timings["network"]
    assert "300" in repr(r) and "211" in repr(r)
    assert model.backend == r.backend and model.info.num_classes == 28
    assert model.info.input_size == (256, 192) and model.info.id == "tiny_a_torchscript.pt2"
    # The class names and colours are known from the model alone, before any call.
    assert model.info.family == "sapiens-v1"
    assert model.info.classes == tuple(r.classes)
    assert model.info.palette == tuple(map(tuple, r.palette.tolist()))
    assert hash(model.info) == hash(model.info)  # a frozen dataclass of plain values


def test_arrays_outlive_their_result_and_model():
    m = segmentation.load(TINY_A, device="cpu", logits=True)
    r = m(PNG)
    labels, logits, expected = r.labels, r.logits, r.labels.copy()
    del r, m
    gc.collect()
    assert np.array_equal(labels, expected) and logits.shape == (28, 300, 211)


def test_logits_when_asked_for(model):
    m = segmentation.load(TINY_A, device="cpu", logits=True)
    r = m(PNG)
    assert r.logits.shape == (28, 300, 211) and r.logits.dtype == np.float32
    assert not r.logits.flags.writeable and not r.logits.flags.owndata
    # The labels are the argmax of these logits (one fused pass in the library).
    assert np.mean(np.argmax(r.logits, axis=0) != r.labels) < 1e-3
    assert model(PNG, logits=True).logits.shape == (28, 300, 211)  # per-call override
    assert m(PNG, logits=False).logits is None


def test_device_pipeline_on_the_cpu(model):
    # The device pipeline (OpenCV's fixed-point resize on tensor ops, labels from tensor ops)
    # also runs on the CPU, and gives the host pipeline's labels.
    dev = segmentation.load(TINY_A, mode="portable", device="cpu", threads=1, pipeline="device")
    a, b = model(PNG), dev(PNG)
    assert a.labels.shape == b.labels.shape == (300, 211)
    assert np.array_equal(a.labels, b.labels)


def test_overlay(model, png_rgb):
    for x in (PNG, png_rgb, Image.open(PNG)):
        r = model(x)
        ov = r.overlay()
        assert ov.shape == (300, 211, 3) and ov.dtype == np.uint8
        assert np.array_equal(r.overlay(0.0), np.ascontiguousarray(png_rgb))
        assert np.array_equal(r.overlay(1), r.palette[r.labels])
        rgb = png_rgb.astype(np.float32)
        blend = (rgb * np.float32(0.5) + r.palette[r.labels].astype(np.float32) * np.float32(0.5))
        assert np.array_equal(ov, blend.astype(np.uint8))
    with pytest.raises(ValueError, match="opacity"):
        r.overlay(1.5)
    with pytest.raises(TypeError, match="opacity"):
        r.overlay("0.5")


# ---- parity -----------------------------------------------------------------------------------

def test_results_equal_the_cli_on_the_same_fixture(model, tmp_path):
    images = [PNG, EXAMPLE, IMAGES / "synth_landscape_480x640.png"]
    out = tmp_path / "out"
    r = subprocess.run([str(CLI), "-q", "segment", *map(str, images), "-o", str(out), "--model",
                        str(TINY_A), "--mode", "portable", "--threads", "1"],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    for img, res in zip(images, model([str(p) for p in images])):
        cli_labels = np.load(out / f"{img.stem}_seg.npy")
        assert np.array_equal(cli_labels, res.labels.astype(np.int64)), img.name
        assert np.array_equal(np.load(out / f"{img.stem}.npy"), res.foreground), img.name
        cli_overlay = cv2.imread(str(out / f"{img.stem}_overlay.png"))[:, :, ::-1]
        assert np.array_equal(cli_overlay, res.overlay()), img.name


@pytest.mark.parametrize("stem", REF_STEMS)
def test_labels_match_the_reference_recipe(model, stem):
    """Tiny-A labels equal those of the authors' recipe (tests/fixtures/make_fixtures.py) away from
    near-ties of the two best classes."""
    image = next(IMAGES.glob(f"{stem}.*"))
    ref = FIXTURES / "ref" / "tiny_a" / stem
    labels = model(image).labels
    ref_labels = np.load(ref / "labels.npy")
    gap = np.load(ref / "top2_gap.npy")
    assert labels.shape == ref_labels.shape
    differ = labels != ref_labels
    assert not np.any(differ & (gap > 0.004)), f"{differ.sum()} labels differ away from ties"


# ---- errors -----------------------------------------------------------------------------------

def test_the_python_error_codes_are_the_librarys():
    # The Python enum is written out for its docstrings; its values must be the library's, and
    # the spellings and exit statuses come from the library's one table.
    native = sapiens_seg._core.error_codes()
    assert [v for v, _, _ in native] == [int(c) for c in ErrorCode]
    for value, label, status in native:
        code = ErrorCode(value)
        assert code.label == label and code.exit_status == status
        assert ErrorCode.from_label(label) is code
        assert label.replace("_error", "").upper() in (code.name, code.name + "_ERROR") or \
            code.name.lower() == label
    assert ErrorCode.IO.label == "io_error" and ErrorCode.IO.exit_status == 19
    with pytest.raises(ValueError):
        ErrorCode.from_label("IO")


def test_option_names_are_the_librarys():
    # The CLI prints its choices from the same table the binding reads.
    names = sapiens_seg._core.option_names()
    help_text = subprocess.run([str(CLI), "segment", "--help"], capture_output=True, text=True,
                               check=True).stdout
    for option in ("mode", "dtype", "normalization", "pipeline", "cubic"):
        assert "{" + ",".join(names[option]) + "}" in help_text, option
    with pytest.raises(ValueError, match="mode: expected one of 'auto', 'portable', 'kernels'"):
        segmentation.load(str(TINY_B), mode="fast")


def test_every_error_code_has_its_own_class():
    classes = {code: sapiens_seg.errors._class_for_code(int(code)) for code in ErrorCode}
    assert len(set(classes.values())) == len(ErrorCode) == 11
    for code, cls in classes.items():
        assert issubclass(cls, SapiensSegError) and cls.code is code
    assert classes[ErrorCode.NOT_FOUND] is WeightsNotFoundError
    assert classes[ErrorCode.CHECKSUM_MISMATCH] is ChecksumError
    assert classes[ErrorCode.DOWNLOAD_FAILED] is DownloadError
    assert classes[ErrorCode.OFFLINE] is OfflineError
    assert classes[ErrorCode.LICENSE_NOT_ACCEPTED] is LicenseNotAcceptedError
    assert classes[ErrorCode.BACKEND_UNAVAILABLE] is BackendUnavailableError
    assert classes[ErrorCode.INVALID_INPUT] is InvalidInputError
    assert classes[ErrorCode.FORMAT_ERROR] is CheckpointFormatError
    assert classes[ErrorCode.IO] is SapiensIOError
    assert classes[ErrorCode.INTERNAL] is InternalError
    assert classes[ErrorCode.OUT_OF_MEMORY] is OutOfMemoryError
    assert issubclass(OutOfMemoryError, MemoryError)
    assert issubclass(WeightsNotFoundError, FileNotFoundError)
    assert issubclass(InvalidInputError, ValueError)
    assert issubclass(SapiensIOError, OSError)
    e = SapiensIOError("disk full")
    assert str(e) == "disk full" and e.code == ErrorCode.IO == 9


def test_broken_checkpoints_raise_checkpoint_format_error():
    with pytest.raises(CheckpointFormatError, match="not a TorchScript archive") as e:
        segmentation.load(FIXTURES / "broken_not_zip.pt2")
    assert e.value.code == ErrorCode.FORMAT_ERROR and isinstance(e.value, SapiensSegError)
    with pytest.raises(CheckpointFormatError, match="wrong shape") as e:
        segmentation.load(FIXTURES / "broken_wrong_shape.pt2")
    assert "broken_wrong_shape" in str(e.value)


def test_backend_unavailable():
    with pytest.raises(BackendUnavailableError, match="kernels") as e:
        segmentation.load(TINY_A, mode="kernels", device="cpu")
    assert e.value.code == ErrorCode.BACKEND_UNAVAILABLE
    if any(d.startswith("float16: no") for d in sapiens_seg.system_info().cpu_dtypes):
        with pytest.raises(BackendUnavailableError, match="AVX512-FP16"):
            segmentation.load(TINY_A, device="cpu", dtype="float16")
        with pytest.raises(BackendUnavailableError, match="float16"):
            segmentation.load(TINY_A, device=torch.device("cpu"), dtype=torch.float16)
    if not sapiens_seg.system_info().cuda_available:
        with pytest.raises(BackendUnavailableError, match="CUDA"):
            segmentation.load(TINY_A, device="cuda:0")


def test_bfloat16_refused_on_a_cpu_without_fast_bf16_gemms():
    # A fresh process: the CPU's capabilities are read once, at the first load.
    code = ("import sapiens_seg, sys\n"
            "from sapiens_seg import segmentation, BackendUnavailableError\n"
            "info = sapiens_seg.system_info()\n"
            "assert 'avx2' in info.cpu_flags and 'avx512_bf16' not in info.cpu_flags, info\n"
            "assert info.backends[0].startswith('portable: cpu (float32)'), info.backends\n"
            "assert info.cpu_dtypes[1].startswith('bfloat16: no: '), info.cpu_dtypes\n"
            "try:\n"
            f"    segmentation.load({str(TINY_A)!r}, device='cpu', dtype='bfloat16')\n"
            "except BackendUnavailableError as e:\n"
            "    print(e)\n"
            "else:\n"
            "    sys.exit('loaded')\n")
    env = clean_env(SAPIENS_SEG_CPU_FLAGS="sse4_2 avx f16c fma avx2",
                    PYTHONPATH=os.pathsep.join([str(PKG_PARENT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "AVX512-BF16 or AMX-BF16" in r.stdout and "AVX2 and FMA" in r.stdout


def test_system_info_describes_the_cpu():
    info = sapiens_seg.system_info()
    assert info.cpu_model
    assert [d.split(":")[0] for d in info.cpu_dtypes] == ["float32", "bfloat16", "float16"]
    assert info.cpu_dtypes[0].startswith("float32: yes")
    bf16 = info.cpu_dtypes[1].startswith("bfloat16: yes")
    assert bf16 == ("bfloat16" in info.backends[0])
    # AVX512-BF16 counts on AMD cores only; on Intel cores bfloat16's speed is AMX's.
    amd = "AuthenticAMD" in open("/proc/cpuinfo", encoding="ascii", errors="replace").read()
    assert bf16 == ("amx_bf16" in info.cpu_flags or ("avx512_bf16" in info.cpu_flags and amd)) \
        or info.onednn_cap
    # The attention kernel follows the CPU's own flags (CPUID), as /proc/cpuinfo lists them.
    flags = set(open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split())
    avx512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"} <= flags
    assert [a.split(":")[0] for a in info.cpu_attention] == ["float32", "bfloat16", "float16"]
    # In float32 the kernel runs on AMD cores only (LibTorch's attention was faster on Intel's).
    f32 = info.cpu_attention[0]
    assert f32.startswith("float32: the library's AVX-512 kernel") == (avx512 and amd)
    assert f32.startswith("float32: the library's AVX2 kernel") == \
        (not avx512 and {"avx2", "fma"} <= flags and amd)
    # In bfloat16 on CPUs with AVX512-BF16 but not AMX-BF16 (whose tiles LibTorch's attention uses).
    amx = {"amx_tile", "amx_bf16"} <= flags
    assert info.cpu_attention[1].startswith("bfloat16: the library's AVX512-BF16 kernel") == \
        (avx512 and "avx512_bf16" in flags and not amx)
    assert ("AMX-BF16" in info.cpu_attention[1]) == (avx512 and "avx512_bf16" in flags and amx)


def test_missing_files_raise_weights_not_found(model, tmp_path):
    with pytest.raises(WeightsNotFoundError, match="nope.pt2") as e:
        segmentation.load(tmp_path / "nope.pt2")
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="nope.png"):
        model(tmp_path / "nope.png")
    with pytest.raises(WeightsNotFoundError, match="no-such-model"):
        segmentation.load("no-such-model")


def test_invalid_images_raise_invalid_input(model):
    with pytest.raises(InvalidInputError, match="at least 32") as e:
        model(np.zeros((20, 20, 3), np.uint8))
    assert isinstance(e.value, ValueError) and e.value.code == ErrorCode.INVALID_INPUT
    with pytest.raises(InvalidInputError, match="cannot decode"):
        model(b"junk")
    with pytest.raises(InvalidInputError, match=r"x\[1\].*HxWx3"):
        model([PNG, np.zeros((40, 40), np.uint8)])
    with pytest.raises(InvalidInputError, match="permute"):
        model(torch.zeros((3, 40, 40), dtype=torch.uint8))


def test_licence_then_missing_weights_of_a_bundled_card(tmp_path, monkeypatch):
    for var in ("SAPIENS_SEG_NONCOMMERCIAL", "SAPIENS_SEG_WEIGHTS_PATH", "SAPIENS_SEG_CARDS",
                "HF_HOME", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SAPIENS_SEG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    # Never reach the network: where the library can download, offline mode stops it first.
    monkeypatch.setenv("SAPIENS_SEG_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LicenseNotAcceptedError, match="CC-BY-NC-4.0") as e:
        segmentation.load("sapiens-seg-0.3b-goliath")
    assert e.value.code == ErrorCode.LICENSE_NOT_ACCEPTED
    assert "accept_noncommercial=True" in str(e.value)  # the Python way, not only C++'s
    # Without downloads the weights are simply not found; with them, offline mode says so.
    with pytest.raises((WeightsNotFoundError, OfflineError)) as e:
        segmentation.load("sapiens-seg-0.3b-goliath", accept_noncommercial=True)
    msg = str(e.value)
    assert "735a9a8d63fe8f3f6a4ca3d787de07e69b1f9708ad550e09bb33c9854b7eafbc" in msg
    assert "sapiens_0.3b_goliath_best_goliath_mIoU_7673_epoch_194_torchscript.pt2" in msg
    assert str(tmp_path / "home" / "weights") in msg


def test_checksum_mismatch_and_a_verified_card(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS_SEG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SAPIENS_SEG_CARDS", str(FIXTURES / "cards"))
    monkeypatch.setenv("SAPIENS_SEG_WEIGHTS_PATH", str(FIXTURES))
    monkeypatch.setenv("SAPIENS_SEG_OFFLINE", "1")
    with pytest.raises(ChecksumError, match="0000000000") as e:
        segmentation.load("fixture-wrong-hash")
    assert e.value.code == ErrorCode.CHECKSUM_MISMATCH
    m = segmentation.load("fixture-tiny-a", device="cpu")
    assert m.info.id == "fixture-tiny-a" and m.info.license == "Apache-2.0"
    assert Path(m.info.path) == FIXTURES / "tiny_a_torchscript.pt2"
    cards = {c.id: c for c in sapiens_seg.list_cards()}
    assert len(cards["fixture-tiny-a"].sha256) == 64
    assert cards["fixture-tiny-a"].source.startswith(str(FIXTURES / "cards"))
    goliath = cards["sapiens-seg-0.3b-goliath"]
    assert goliath.sha256.startswith("735a9a8d") and not goliath.commercial_use
    assert goliath.license == "CC-BY-NC-4.0" and len(goliath.classes) == 28


@pytest.mark.parametrize("kwargs, exc, name", [
    ({"mode": "warp"}, ValueError, "mode"),
    ({"mode": 3}, TypeError, "mode"),
    ({"device": "tpu"}, ValueError, "device"),
    ({"device": 0}, TypeError, "device"),
    ({"dtype": "float64"}, ValueError, "dtype"),
    ({"dtype": torch.float64}, ValueError, "dtype"),
    ({"logits": "yes"}, TypeError, "logits"),
    ({"normalization": "imagenet"}, ValueError, "normalization"),
    ({"accept_noncommercial": 1}, TypeError, "accept_noncommercial"),
    ({"threads": -1}, ValueError, "threads"),
    ({"threads": 1.5}, TypeError, "threads"),
    ({"input_size": 512}, TypeError, "input_size"),
    ({"pipeline": "gpu"}, ValueError, "pipeline"),
])
def test_invalid_arguments_name_the_argument(kwargs, exc, name):
    with pytest.raises(exc, match=name) as e:
        segmentation.load(TINY_A, **kwargs)
    assert not isinstance(e.value, SapiensSegError)


def test_invalid_call_arguments_name_the_argument(model):
    with pytest.raises(TypeError, match="name_or_path"):
        segmentation.load(42)
    with pytest.raises(TypeError, match="x: expected a path"):
        model(42)
    with pytest.raises(TypeError, match=r"x\[1\]"):
        model([PNG, 3.5])
    with pytest.raises(TypeError, match="uint8"):
        model(np.zeros((40, 40, 3), np.float32))
    with pytest.raises(TypeError, match="uint8"):
        model(torch.zeros((40, 40, 3)))
    with pytest.raises(TypeError, match="logits"):
        model(PNG, logits=1)


# ---- threads, GIL, memory --------------------------------------------------------------------

def test_eight_threads_on_one_model_agree_with_serial_calls(model):
    paths = [next(IMAGES.glob(f"{s}.*")) for s in REF_STEMS] or [PNG, SMALL, EXAMPLE]
    arrays = [segmentation.read_image(p) for p in paths]
    serial = [model(p).labels.copy() for p in paths]

    def work(t: int) -> int:
        bad = 0
        for i in range(len(paths)):
            k = (i + t) % len(paths)
            x = paths[k] if (i + t) % 2 else arrays[k]
            bad += not np.array_equal(model(x).labels, serial[k])
        return bad

    with ThreadPoolExecutor(max_workers=8) as pool:
        mismatches = list(pool.map(work, range(8)))
    assert mismatches == [0] * 8


def test_the_gil_is_released_during_inference():
    m = segmentation.load(TINY_B, device="cpu")
    image = segmentation.read_image(EXAMPLE)
    t0 = time.perf_counter()
    m(image)
    one_call = time.perf_counter() - t0
    done = threading.Event()

    def infer():
        for _ in range(2):
            m(image)
        done.set()

    worker = threading.Thread(target=infer)
    worker.start()
    longest_gap, last = 0.0, time.perf_counter()
    while not done.is_set():  # this thread keeps running while the other one is in C++
        now = time.perf_counter()
        longest_gap, last = max(longest_gap, now - last), now
        time.sleep(0.001)
    worker.join()
    assert longest_gap < max(0.5 * one_call, 0.05), (longest_gap, one_call)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_no_leak_over_200_calls(model):
    # 480x640: a leaked result (labels 0.3 MB, pixels 0.9 MB, overlay 0.9 MB, logits 34 MB)
    # would show well above the bound.
    path = IMAGES / "synth_landscape_480x640.png"
    rgb = segmentation.read_image(path)
    data = path.read_bytes()

    def call(i: int) -> None:
        x = (path, rgb, data, Image.fromarray(rgb))[i % 4]
        r = model(x, logits=i % 5 == 0)
        r.overlay()
        _ = r.foreground, r.classes, r.palette, r.timings

    for i in range(20):
        call(i)
    gc.collect()
    before = _rss_mb()
    for i in range(200):
        call(i)
    gc.collect()
    growth = _rss_mb() - before
    assert growth < 50, f"RSS grew by {growth:.1f} MB over 200 calls"


# ---- cards, system, CLI -----------------------------------------------------------------------

def test_system_info_and_cards():
    info = sapiens_seg.system_info()
    assert info.version == sapiens_seg.__version__
    assert any(b.startswith("portable") for b in info.backends)
    assert info.threads >= 1
    ids = [c.id for c in sapiens_seg.list_cards()]
    assert "sapiens-seg-0.3b-goliath" in ids and ids == sorted(ids)


def _python_m(*args: str, **kw) -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=os.pathsep.join([str(PKG_PARENT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "sapiens_seg", *args], capture_output=True,
                          text=True, env=env, timeout=300, **kw)


def test_python_m_sapiens_seg_runs_the_cli(model, tmp_path):
    r = _python_m("info")
    assert r.returncode == 0, r.stderr
    assert f"sapiens-seg {sapiens_seg.__version__}" in r.stdout and "backends:" in r.stdout
    r = _python_m("--version")
    assert r.returncode == 0 and sapiens_seg.__version__ in r.stdout
    assert _python_m("no-such-command").returncode == 2
    # The CLI's own exit status comes through: 11 = not found.
    r = _python_m("segment", str(PNG), "-o", str(tmp_path / "o"), "--model",
                  str(tmp_path / "nope.pt2"))
    assert r.returncode == 11 and "nope.pt2" in r.stderr
    r = _python_m("segment", str(PNG), "-o", str(tmp_path / "o"), "--model", str(TINY_A),
                  "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "o" / "synth_300x211_seg.npy"), model(PNG).labels)
