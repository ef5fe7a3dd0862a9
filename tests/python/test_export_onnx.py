"""tools/export_onnx.py: the peers' ONNX export is the project's network with the file's weights,
and is checked against the original (the TorchScript file) before anyone times it.

Needs the benchmark extras (`tools/setup.sh --bench`: onnx, onnxruntime); skipped without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FIXTURES, use_oracles_and_tools

use_oracles_and_tools()

pytest.importorskip("onnx", reason="benchmark extra (tools/setup.sh --bench)")
pytest.importorskip("onnxruntime", reason="benchmark extra (tools/setup.sh --bench)")

import export_onnx  # noqa: E402


def test_v1_export_matches_the_torchscript_file(tmp_path):
    out = tmp_path / "tiny_a.onnx"
    info = export_onnx.export(FIXTURES / "tiny_a_torchscript.pt2", out, log=lambda *a: None)
    side = json.loads((tmp_path / "tiny_a.onnx.json").read_text())
    assert side == info
    assert info["family"] == "sapiens_v1" and info["input"] == [256, 192]
    assert info["max_abs_logit_diff"] <= 2e-3 and info["label_agreement"] == 1.0
    assert "TorchScript" in info["checked_against"]


def test_a_wrong_export_is_refused(tmp_path, monkeypatch):
    # The check must bite: swap two heads' worth of the first qkv bias after building the model.
    real = export_onnx.v1_model

    def broken(path):
        model, script, hw = real(path)
        b = model.backbone.layers[0].attn.qkv.bias
        b.data = b.data.flip(0).clone()
        return model, script, hw

    monkeypatch.setattr(export_onnx, "v1_model", broken)
    with pytest.raises(export_onnx.ExportError, match="differ from the original"):
        export_onnx.export(FIXTURES / "tiny_a_torchscript.pt2", tmp_path / "bad.onnx",
                           log=lambda *a: None)
