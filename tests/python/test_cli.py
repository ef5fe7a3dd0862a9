"""The sapiens-seg CLI end to end: outputs, exit codes, the main job's failure and success paths.

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES)."""

import json
import os
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import REPO, FIXTURES, CLI
EXAMPLE = REPO / "examples" / "astronaut.jpg"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")


def run(*args, env=None, **kw):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    full_env.update(env or {})
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=600, **kw)


@pytest.fixture()
def isolated(tmp_path):
    """An environment with an empty cache and no weights anywhere."""
    return {"SAPIENS_SEG_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hf"),
            "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def test_segment_tiny_b_writes_every_output(tmp_path):
    out = tmp_path / "out"
    images = [EXAMPLE, FIXTURES / "images" / "synth_landscape_480x640.png"]
    r = run("segment", *images, "-o", out, "--model", FIXTURES / "tiny_b_torchscript.pt2",
            "--batch", "2")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == {"mode": "portable", "device": "cpu", "dtype": "float32"}
    assert len(summary["images"]) == 2
    by_input = {e["input"]: e for e in summary["images"]}  # completion order, not input order
    for img in images:
        entry = by_input[str(img)]
        stem = img.stem
        src = cv2.imread(str(img))
        labels = np.load(out / f"{stem}_seg.npy")
        fg = np.load(out / f"{stem}.npy")
        png = cv2.imread(str(out / f"{stem}_seg.png"), cv2.IMREAD_UNCHANGED)
        overlay = cv2.imread(str(out / f"{stem}_overlay.png"))
        assert labels.dtype == np.int64 and labels.shape == src.shape[:2]
        assert fg.dtype == np.bool_ and np.array_equal(fg, labels > 0)
        assert np.array_equal(png.astype(np.int64), labels)
        assert overlay.shape == src.shape
        assert labels.min() >= 0 and labels.max() < 28
        assert entry["height"] == src.shape[0] and entry["width"] == src.shape[1]
        assert sum(entry["classes"].values()) == src.shape[0] * src.shape[1]
        assert str(out / f"{stem}_seg.png") in r.stdout


def test_cli_labels_equal_the_reference_labels(tmp_path):
    """The CLI on Tiny-A gives the labels of the authors' recipe (tests/reference/sapiens_v1.py,
    through tests/fixtures/make_fixtures.py)."""
    img = FIXTURES / "images" / "synth_300x211.png"
    r = run("segment", img, "-o", tmp_path, "--model", FIXTURES / "tiny_a_torchscript.pt2")
    assert r.returncode == 0, r.stderr
    labels = np.load(tmp_path / "synth_300x211_seg.npy")
    ref = FIXTURES / "ref" / "tiny_a" / "synth_300x211"
    ref_labels = np.load(ref / "labels.npy")
    gap = np.load(ref / "top2_gap.npy")
    differ = labels != ref_labels
    assert not np.any(differ & (gap > 0.004)), f"{differ.sum()} labels differ away from ties"


def test_main_job_fails_fast_without_weights_then_succeeds_from_a_card_overlay(tmp_path, isolated):
    # The README's main job on a machine with no weights and no way to fetch them: a quick,
    # precise failure. The Hub is replaced by a closed loopback port (tests never go online).
    unreachable = dict(isolated, HF_ENDPOINT="http://127.0.0.1:9", SAPIENS_SEG_RETRY_BASE_MS="20")
    for env, code in ((unreachable, 13), (dict(isolated, SAPIENS_SEG_OFFLINE="1"), 14)):
        t0 = time.monotonic()
        r = run("segment", EXAMPLE, "-o", tmp_path / "out", "--accept-noncommercial", env=env)
        elapsed = time.monotonic() - t0
        assert r.returncode == code, r.stderr  # download failed / offline
        assert elapsed < 10
        for part in ("sapiens_0.3b_goliath_best_goliath_mIoU_7673_epoch_194_torchscript.pt2",
                     "735a9a8d63fe8f3f6a4ca3d787de07e69b1f9708ad550e09bb33c9854b7eafbc",
                     "/facebook/sapiens-seg-0.3b-torchscript/resolve/",
                     str(tmp_path / "home" / "weights")):
            assert part in r.stderr
    # Without accepting the licence it says so first.
    r = run("segment", EXAMPLE, "-o", tmp_path / "out", env=unreachable)
    assert r.returncode == 15 and "SAPIENS_SEG_NONCOMMERCIAL=1" in r.stderr

    # The same command succeeds once a file matching a card is where the message said: a card
    # overlay describes the Tiny-B fixture, and the file is placed in the cache folder.
    weights = tmp_path / "home" / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    (weights / "tiny_b_torchscript.pt2").write_bytes((FIXTURES / "tiny_b_torchscript.pt2").read_bytes())
    env = {**isolated, "SAPIENS_SEG_CARDS": str(FIXTURES / "cards")}
    r = run("segment", EXAMPLE, "-o", tmp_path / "out", "--model", "fixture-tiny-b", env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "astronaut_seg.npy").exists()


def test_a_bad_image_does_not_cost_the_others(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(EXAMPLE.read_bytes()[:4000])
    r = run("segment", bad, EXAMPLE, "-o", tmp_path / "out", "--model",
            FIXTURES / "tiny_a_torchscript.pt2")
    assert r.returncode == 17, r.stderr  # invalid input
    assert "truncated JPEG" in r.stderr
    assert (tmp_path / "out" / "astronaut_seg.npy").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["images"][0]["error"] == "invalid_input"


def test_exit_codes_differ_per_error_class(tmp_path):
    tiny = FIXTURES / "tiny_a_torchscript.pt2"
    cases = [
        (["segment", EXAMPLE, "-o", tmp_path, "--model", FIXTURES / "broken_not_zip.pt2"], 18),
        (["segment", EXAMPLE, "-o", tmp_path, "--model", tiny, "--mode", "kernels"], 16),
        (["segment", EXAMPLE, "-o", tmp_path, "--model", "no-such-model"], 11),
        (["models", "path", "sapiens-seg-1b-goliath"], None),
        (["segment", EXAMPLE, "-o", tmp_path, "--model", tiny, "--mode", "warp"], 2),
        (["segment", tmp_path / "missing.jpg", "-o", tmp_path], 11),
        (["segment", EXAMPLE, "-o", tmp_path, "--batch-size", "0"], 2),
    ]
    for args, code in cases:
        r = run(*args, env={"SAPIENS_SEG_HOME": str(tmp_path / "home")})
        assert r.returncode == (11 if code is None else code), (args, r.returncode, r.stderr)


def test_unwritable_output_fails_before_loading(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = run("segment", EXAMPLE, "-o", blocker / "sub", "--model", FIXTURES / "tiny_a_torchscript.pt2")
    assert r.returncode == 19, r.stderr
    assert "cannot create output folder" in r.stderr


def test_models_and_info():
    r = run("models")
    assert r.returncode == 0
    for v in ("0.3b", "0.6b", "1b", "2b"):
        assert f"sapiens-seg-{v}-goliath" in r.stdout
    assert "NOT PINNED" in r.stdout  # 2b has no published hash
    r = run("info")
    assert r.returncode == 0
    assert "libtorch" in r.stdout and "kernels: unavailable" in r.stdout


# ---- CPU dtypes follow the CPU's instructions (issue: bfloat16 on AVX2-only CPUs) -------------

AVX2_ONLY = "fpu sse sse2 sse4_1 sse4_2 avx f16c fma avx2"  # an AVX2 + FMA CPU's flags
# An Intel Xeon whose AMX is hidden (a VM): AVX512-BF16 there runs bfloat16 GEMMs at 0.6x float32.
XEON_NO_AMX = {"SAPIENS_SEG_CPU_FLAGS": AVX2_ONLY + " avx512f avx512dq avx512bw avx512vl "
               "avx512_bf16 avx512_fp16", "SAPIENS_SEG_CPU_VENDOR": "GenuineIntel"}


def test_info_lists_the_cpu_dtypes_and_why():
    r = run("info", env={"SAPIENS_SEG_CPU_FLAGS": AVX2_ONLY})
    assert r.returncode == 0, r.stderr
    assert "cpu flags   avx2 fma f16c\n" in r.stdout
    assert "portable: cpu (float32)" in r.stdout
    assert "float32: yes" in r.stdout
    assert "bfloat16: no: " in r.stdout and "AVX512-BF16 or AMX-BF16" in r.stdout
    assert "float16: no: " in r.stdout and "AVX512-FP16 or AMX-FP16" in r.stdout
    assert "cpu attention (portable):\n  float32: " in r.stdout
    r = run("info", env={"DNNL_MAX_CPU_ISA": "AVX2"})
    assert r.returncode == 0, r.stderr
    assert "oneDNN capped: DNNL_MAX_CPU_ISA=AVX2" in r.stdout
    assert "bfloat16: no: " in r.stdout


@pytest.mark.parametrize("env", [{"SAPIENS_SEG_CPU_FLAGS": AVX2_ONLY}, XEON_NO_AMX,
                                 {"DNNL_MAX_CPU_ISA": "AVX2"}],
                         ids=["avx2-cpu", "intel-without-amx", "onednn-cap"])
def test_bfloat16_is_refused_where_the_cpu_has_no_fast_bf16_gemm(tmp_path, env):
    out = tmp_path / "out"
    r = run("segment", EXAMPLE, "-o", out, "--model", FIXTURES / "tiny_a_torchscript.pt2",
            "--dtype", "bfloat16", env=env)
    assert r.returncode == 16, r.stderr  # backend unavailable
    assert "bfloat16" in r.stderr and "AVX512-BF16" in r.stderr and "float32" in r.stderr
    assert not list(out.glob("*_seg.*"))
    # Before any work: the dtype is refused before the checkpoint is even looked for.
    r = run("segment", EXAMPLE, "-o", out, "--model", tmp_path / "missing_torchscript.pt2",
            "--dtype", "bfloat16", env=env)
    assert r.returncode == 16, r.stderr
    # float32 still runs there.
    r = run("segment", EXAMPLE, "-o", out, "--model", FIXTURES / "tiny_a_torchscript.pt2",
            "--save", "labels", env=env)
    assert r.returncode == 0, r.stderr


def test_bfloat16_runs_where_the_cpu_has_it(tmp_path):
    flags = open("/proc/cpuinfo", encoding="ascii", errors="replace").read()
    if " amx_bf16" not in flags and not (" avx512_bf16" in flags and "AuthenticAMD" in flags):
        pytest.skip("this CPU has neither AMX-BF16 nor AMD's AVX512-BF16 (bfloat16 is refused)")
    r = run("segment", EXAMPLE, "-o", tmp_path, "--model", FIXTURES / "tiny_a_torchscript.pt2",
            "--dtype", "bfloat16", "--save", "json")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["backend"]["dtype"] == "bfloat16"
