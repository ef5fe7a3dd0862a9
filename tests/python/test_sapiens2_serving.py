"""Sapiens2 through the CLI and the Python binding: both serve the 29-class DOME label set, give
the labels of the reference pipeline (tests/fixtures/sapiens2.py), and refuse the `original`
mode with the reason.

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import REPO, BUILD, FIXTURES, CLI
S2 = FIXTURES / "s2_tiny.safetensors"
S2_HF = FIXTURES / "s2_tiny_hf.safetensors"
V1 = FIXTURES / "tiny_b_torchscript.pt2"

pytestmark = [
    pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built"),
    pytest.mark.skipif(not S2.exists(), reason=f"no Sapiens2 fixtures in {FIXTURES}"),
]


def run(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    full_env.update(env or {})
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=600)


def reference(stem: str) -> tuple[np.ndarray, np.ndarray]:
    ref = FIXTURES / "ref" / "s2_tiny" / stem
    return np.load(ref / "labels.npy"), np.load(ref / "top2_gap.npy")


def test_cli_segments_with_29_classes_and_the_reference_labels(tmp_path):
    img = FIXTURES / "images" / "synth_1080x1920.png"  # the width shrinks: INTER_AREA
    home = {"SAPIENS_SEG_HOME": str(tmp_path / "home")}
    r = run("segment", img, "-o", tmp_path / "out", "--model", S2, "--save", "labels,npy,json",
            env=home)
    assert r.returncode == 0, r.stderr
    labels = np.load(tmp_path / "out" / "synth_1080x1920_seg.npy")
    ref_labels, gap = reference("synth_1080x1920")
    assert labels.shape == ref_labels.shape
    differ = labels != ref_labels
    assert not np.any(differ & (gap > 0.004)), f"{differ.sum()} labels differ away from ties"
    assert labels.max() < 29
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    per_image = summary["images"][0]["classes"]
    assert sum(per_image.values()) == labels.size
    names = set(per_image)
    assert names <= set(json.loads((REPO / "cards" / "sapiens2-seg-0.4b.json").read_text())
                        ["labels"]["classes"])
    assert len(names) >= 3


def test_cli_refuses_the_original_mode_for_sapiens2(tmp_path):
    r = run("segment", FIXTURES / "images" / "synth_300x211.png", "-o", tmp_path,
            "--model", S2, "--mode", "original", env={"SAPIENS_SEG_HOME": str(tmp_path / "h")})
    assert r.returncode == 10 + 6  # BackendUnavailable
    assert "original mode does not exist for Sapiens2" in r.stderr


def test_licence_notice_is_shown_once(tmp_path):
    env = {"SAPIENS_SEG_HOME": str(tmp_path / "home"), "SAPIENS_SEG_CARDS": str(FIXTURES / "cards"),
           "SAPIENS_SEG_WEIGHTS_PATH": str(FIXTURES), "SAPIENS_SEG_OFFLINE": "1"}
    img = FIXTURES / "images" / "synth_33x47.png"
    first = run("segment", img, "-o", tmp_path / "a", "--model", "s2-tiny", env=env)
    assert first.returncode == 0, first.stderr
    assert "licence notice" in first.stderr and "surveillance" in first.stderr
    second = run("segment", img, "-o", tmp_path / "b", "--model", "s2-tiny", env=env)
    assert second.returncode == 0, second.stderr
    assert "licence notice" not in second.stderr


def test_binding_serves_both_families_with_their_label_sets(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS_SEG_HOME", str(tmp_path / "home"))
    sys.path.insert(0, str(BUILD / "python"))
    from sapiens_seg import BackendUnavailableError, segmentation

    img = FIXTURES / "images" / "synth_1080x1920.png"  # INTER_AREA: byte-identical to cv2
    s2 = segmentation.load(str(S2))
    v1 = segmentation.load(str(V1))
    assert s2.info.family == "sapiens2" and v1.info.family == "sapiens-v1"
    r2, r1 = s2(str(img)), v1(str(img))
    assert len(r2.classes) == 29 and r2.classes[2] == "Eyeglass"
    assert len(r1.classes) == 28 and r1.classes[2] == "Face_Neck"
    assert r2.palette.shape == (29, 3)
    ref_labels, gap = reference("synth_1080x1920")
    differ = r2.labels != ref_labels
    assert not np.any(differ & (gap > 0.004))
    # The transformers naming of the same weights: the same labels.
    assert np.array_equal(segmentation.load(str(S2_HF))(str(img)).labels, r2.labels)
    with pytest.raises(BackendUnavailableError, match="original mode does not exist"):
        segmentation.load(str(S2), mode="original")
    # An RGB array goes through the same resize rule as a file.
    rgb = cv2.cvtColor(cv2.imread(str(img)), cv2.COLOR_BGR2RGB)
    assert np.array_equal(s2(rgb).labels, r2.labels)
