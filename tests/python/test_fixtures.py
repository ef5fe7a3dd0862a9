"""Tests for the Sapiens v1 fixtures (tests/fixtures/sapiens_v1.py, made by
tests/fixtures/make_fixtures.py): the Tiny-A fixture must match the spec
(shared/spec/sapiens_v1.md §3, §9, §10) and the broken variants must be broken as named."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import use_oracles_and_tools

use_oracles_and_tools()

from fixtures import make_fixtures as mf  # noqa: E402
from fixtures import sapiens_v1 as v1f  # noqa: E402
from reference import sapiens_v1 as v1ref  # noqa: E402

# torch.jit.load/trace announce their deprecation on every call.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

# Spec §10, Tiny-A: C=64, L=2, heads 2, MLP 256, head channels 32, input 256x192, grid 16x12.
# Written out by hand (not derived from the fixture code) so the test is independent of it.
TINY_A_BUFFERS = {
    "data_preprocessor.mean": (3, 1, 1),
    "data_preprocessor.std": (3, 1, 1),
}
TINY_A_PARAMS = {
    "backbone.pos_embed": (1, 192, 64),
    "backbone.patch_embed.projection.weight": (64, 3, 16, 16),
    "backbone.patch_embed.projection.bias": (64,),
    **{
        f"backbone.layers.{i}.{k}": s
        for i in (0, 1)
        for k, s in {
            "ln1.weight": (64,), "ln1.bias": (64,),
            "attn.qkv.weight": (192, 64), "attn.qkv.bias": (192,),
            "attn.proj.weight": (64, 64), "attn.proj.bias": (64,),
            "ln2.weight": (64,), "ln2.bias": (64,),
            "ffn.layers.0.0.weight": (256, 64), "ffn.layers.0.0.bias": (256,),
            "ffn.layers.1.weight": (64, 256), "ffn.layers.1.bias": (64,),
        }.items()
    },
    "backbone.ln1.weight": (64,),
    "backbone.ln1.bias": (64,),
    "decode_head.conv_seg.weight": (28, 32, 1, 1),
    "decode_head.conv_seg.bias": (28,),
    "decode_head.deconv_layers.0.weight": (64, 32, 4, 4),
    "decode_head.deconv_layers.3.weight": (32, 32, 4, 4),
    "decode_head.deconv_layers.6.weight": (32, 32, 4, 4),
    **{
        f"decode_head.conv_layers.{j}.{k}": s
        for j in (0, 3, 6)
        for k, s in (("weight", (32, 32, 1, 1)), ("bias", (32,)))
    },
}


def entries(m) -> dict[str, tuple[int, ...]]:
    out = {n: tuple(t.shape) for n, t in m.named_parameters()}
    out.update({n: tuple(t.shape) for n, t in m.named_buffers()})
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixtures")
    v1f.build_all(out, names=["tiny_a"], log=lambda *a, **k: None)
    return out


@pytest.fixture(scope="module")
def tiny_a(built):
    return torch.jit.load(str(built / "tiny_a_torchscript.pt2"), map_location="cpu")


def test_spec_list_has_42_entries():
    assert len(TINY_A_PARAMS) == 40 and len(TINY_A_BUFFERS) == 2


def test_file_keys_match_spec(tiny_a):
    params = {n: tuple(p.shape) for n, p in tiny_a.named_parameters()}
    buffers = {n: tuple(b.shape) for n, b in tiny_a.named_buffers()}
    assert params == TINY_A_PARAMS
    assert buffers == TINY_A_BUFFERS
    assert all(p.dtype == torch.float32 for p in tiny_a.parameters())
    bufs = dict(tiny_a.named_buffers())
    assert bufs["data_preprocessor.mean"].flatten().tolist() == pytest.approx(v1ref.MEAN_TRAIN)
    assert bufs["data_preprocessor.std"].flatten().tolist() == pytest.approx(v1ref.STD_TRAIN)


def test_eager_order_matches_spec():
    model = v1f.build_model(v1f.FIXTURES["tiny_a"])
    # Non-persistent buffers stay out of the eager state_dict, as in the authors' model.
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == \
        list(TINY_A_PARAMS.items())
    assert [n for n, _ in model.named_buffers()] == list(TINY_A_BUFFERS)


def test_no_default_initialised_tensors(tiny_a):
    for name, p in tiny_a.named_parameters():
        assert not torch.all(p == 0), name
        assert not torch.all(p == 1), name
        assert p.flatten().unique().numel() > 1, name


def test_output_shape_and_batch(tiny_a):
    x = v1f.example_input(v1f.FIXTURES["tiny_a"], batch=2)
    with torch.no_grad():
        y1 = tiny_a(x[:1])
        y2 = tiny_a(x)
    assert tuple(y1.shape) == (1, 28, 128, 96)
    assert tuple(y2.shape) == (2, 28, 128, 96)
    torch.testing.assert_close(y2[:1], y1, rtol=1e-4, atol=1e-4)


def spec_forward(sd: dict[str, torch.Tensor], x: torch.Tensor, heads: int) -> torch.Tensor:
    """Spec §9 written with plain functional ops (explicit softmax attention)."""
    c = sd["backbone.pos_embed"].shape[-1]
    t = F.conv2d(x, sd["backbone.patch_embed.projection.weight"],
                 sd["backbone.patch_embed.projection.bias"], stride=16)
    b, _, h, w = t.shape
    t = t.flatten(2).transpose(1, 2) + sd["backbone.pos_embed"]
    n, hd = h * w, c // heads
    depth = len({k.split(".")[2] for k in sd if k.startswith("backbone.layers.")})
    for i in range(depth):
        p = f"backbone.layers.{i}."
        y = F.layer_norm(t, (c,), sd[p + "ln1.weight"], sd[p + "ln1.bias"], eps=1e-6)
        q, k, v = F.linear(y, sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]).split(c, -1)
        q, k, v = (z.reshape(b, n, heads, hd).transpose(1, 2) for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1) @ v
        a = a.transpose(1, 2).reshape(b, n, c)
        t = t + F.linear(a, sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"])
        y = F.layer_norm(t, (c,), sd[p + "ln2.weight"], sd[p + "ln2.bias"], eps=1e-6)
        y = F.gelu(F.linear(y, sd[p + "ffn.layers.0.0.weight"], sd[p + "ffn.layers.0.0.bias"]))
        t = t + F.linear(y, sd[p + "ffn.layers.1.weight"], sd[p + "ffn.layers.1.bias"])
    t = F.layer_norm(t, (c,), sd["backbone.ln1.weight"], sd["backbone.ln1.bias"], eps=1e-6)
    f = t.transpose(1, 2).reshape(b, c, h, w)
    for j in (0, 3, 6):
        f = F.conv_transpose2d(f, sd[f"decode_head.deconv_layers.{j}.weight"], stride=2, padding=1)
        f = F.silu(F.instance_norm(f, eps=1e-5))
    for j in (0, 3, 6):
        f = F.conv2d(f, sd[f"decode_head.conv_layers.{j}.weight"],
                     sd[f"decode_head.conv_layers.{j}.bias"])
        f = F.silu(F.instance_norm(f, eps=1e-5))
    return F.conv2d(f, sd["decode_head.conv_seg.weight"], sd["decode_head.conv_seg.bias"])


def test_file_matches_spec_forward(tiny_a):
    sd = {n: p.detach() for n, p in tiny_a.named_parameters()}
    x = v1f.example_input(v1f.FIXTURES["tiny_a"], batch=2, seed=3) * 4 - 2
    with torch.no_grad():
        torch.testing.assert_close(tiny_a(x), spec_forward(sd, x, heads=2), rtol=1e-4, atol=1e-4)


def test_broken_truncated_and_not_zip(built):
    for name, zip_start in (("broken_truncated.pt2", True), ("broken_not_zip.pt2", False)):
        path = built / name
        assert path.read_bytes().startswith(b"PK\x03\x04") == zip_start, name
        assert not zipfile.is_zipfile(path)
        with pytest.raises(Exception):
            torch.jit.load(str(path))
    good = (built / "tiny_a_torchscript.pt2").read_bytes()
    trunc = (built / "broken_truncated.pt2").read_bytes()
    assert trunc == good[: len(trunc)] and len(trunc) == int(len(good) * 0.6)
    assert (built / "broken_not_zip.pt2").read_bytes().startswith(b"this is not a TorchScript")


def test_broken_missing_tensor(built):
    m = torch.jit.load(str(built / "broken_missing_tensor.pt2"))
    want = {**TINY_A_PARAMS, **TINY_A_BUFFERS}
    del want["decode_head.conv_layers.0.bias"]
    assert entries(m) == want


def test_broken_unexpected_tensor(built):
    m = torch.jit.load(str(built / "broken_unexpected_tensor.pt2"))
    assert entries(m) == {**TINY_A_PARAMS, **TINY_A_BUFFERS, "backbone.cls_token": (1, 1, 64)}


def test_broken_wrong_shape(built):
    m = torch.jit.load(str(built / "broken_wrong_shape.pt2"))
    want = {**TINY_A_PARAMS, **TINY_A_BUFFERS, "backbone.layers.1.ln2.weight": (65,)}
    assert entries(m) == want
    with pytest.raises(RuntimeError):
        m(v1f.example_input(v1f.FIXTURES["tiny_a"]))


def test_broken_wrong_dtype(built):
    m = torch.jit.load(str(built / "broken_wrong_dtype.pt2"))
    assert entries(m) == {**TINY_A_PARAMS, **TINY_A_BUFFERS}
    dtypes = {n: p.dtype for n, p in m.named_parameters()}
    assert dtypes.pop("backbone.ln1.weight") == torch.float64
    assert set(dtypes.values()) == {torch.float32}


def test_broken_flipped_byte(built):
    # torch reads the damaged file without complaint (it checks no CRC); only the CRC-32 of the
    # record tells, which zipfile checks.
    path = built / "broken_flipped_byte.pt2"
    good = (built / "tiny_a_torchscript.pt2").read_bytes()
    bad = path.read_bytes()
    diff = [i for i in range(len(good)) if good[i] != bad[i]]
    assert len(bad) == len(good) and len(diff) == 1 and bin(good[diff[0]] ^ bad[diff[0]]).count("1") == 1
    with zipfile.ZipFile(path) as z:
        assert "/data/" in z.testzip()
    m = torch.jit.load(str(path))
    assert m(v1f.example_input(v1f.FIXTURES["tiny_a"])).shape == (1, 28, 128, 96)


def test_deflated_copy_is_read_by_torch_with_the_same_outputs(built):
    path = built / "tiny_a_deflated.pt2"
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(built / "tiny_a_torchscript.pt2") as orig:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
        assert [i.filename for i in z.infolist()] == [i.filename for i in orig.infolist()]
        assert z.testzip() is None
    x = v1f.example_input(v1f.FIXTURES["tiny_a"])
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(path))(x),
                                   torch.jit.load(str(built / "tiny_a_torchscript.pt2"))(x),
                                   rtol=0, atol=0)


def test_cards(built):
    path = built / "tiny_a_torchscript.pt2"
    card = json.loads((built / "cards" / "tiny_a.json").read_text())
    assert list(card) == ["schema", "id", "family", "description", "repo", "revision", "url",
                          "file", "size", "sha256", "license", "format", "input", "preprocess",
                          "arch", "labels"]
    assert card["schema"] == 1 and card["id"] == "fixture-tiny-a"
    assert card["file"] == path.name and card["size"] == path.stat().st_size
    assert card["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert card["input"] == {"height": 256, "width": 192}
    assert card["arch"] == {"patch": 16, "embed_dim": 64, "depth": 2, "heads": 2, "mlp": 256,
                            "head_channels": 32, "num_classes": 28}
    assert card["preprocess"]["mean"] == [123.5, 116.5, 103.5]
    labels = card["labels"]
    assert len(labels["classes"]) == 28 and len(labels["palette"]) == 28
    assert labels["classes"][0] == "Background" and labels["palette"][0] == [50, 50, 50]
    assert labels["classes"][27] == "Tongue" and labels["palette"][27] == [82, 21, 114]

    wrong = json.loads((built / "cards" / "broken-wrong-hash.json").read_text())
    assert wrong["id"] == "fixture-wrong-hash" and wrong["sha256"] == "0" * 64
    assert wrong["file"] == card["file"] and wrong["size"] == card["size"]


def test_references_follow_lite_pipeline(built, tiny_a):
    ref = built / "ref" / "tiny_a"
    img_path = built / "images" / "synth_300x211.png"
    z = {f.stem: np.load(f) for f in (ref / "synth_300x211").glob("*.npy")}
    img = cv2.imread(str(img_path), cv2.IMREAD_COLOR)
    assert img.shape[:2] == (300, 211)
    resized = cv2.resize(img, (192, 256), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(z["resized"], resized)
    rgb = resized[:, :, ::-1].transpose(2, 0, 1).astype(np.float32)
    mean = np.array([123.5, 116.5, 103.5], np.float32)[:, None, None]
    std = np.array([58.5, 57.0, 57.5], np.float32)[:, None, None]
    np.testing.assert_allclose(z["input"], (rgb - mean) / std, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        logits = tiny_a(torch.from_numpy(z["input"])[None])
    np.testing.assert_allclose(z["logits"], logits[0].numpy(), rtol=1e-5, atol=1e-5)
    up = F.interpolate(torch.from_numpy(z["logits"])[None], size=(300, 211), mode="bilinear")
    assert z["labels"].dtype == np.uint8 and z["labels"].shape == (300, 211)
    sure = z["top2_gap"] > 1e-4
    np.testing.assert_array_equal(z["labels"][sure], up.argmax(1)[0].numpy()[sure])
    assert len(np.unique(z["labels"])) >= 3

    batch = np.load(ref / "batch" / "logits.npy")
    first_stem = (ref / "batch" / "stems.txt").read_text().split()[0]
    first = np.load(ref / first_stem / "logits.npy")
    assert batch.shape == (2, 28, 128, 96)
    np.testing.assert_allclose(batch[0], first, rtol=1e-4, atol=1e-4)


def test_a_run_is_skipped_while_what_it_wrote_stands(tmp_path, capsys):
    """ctest regenerates fixtures before every run that needs them; make_fixtures skips a run
    whose arguments, generators and libraries are those of a recorded run whose files all stand
    unchanged, and builds again as soon as one differs."""
    out = tmp_path / "fixtures"
    (out / "ref").mkdir(parents=True)
    written = out / "ref" / "labels.npy"
    written.write_bytes(b"labels")
    args = argparse.Namespace(only=["tiny_a"], wide=False, images=[])
    record, key = mf.run_key(args)
    mf.record_run(out, record, key, since_ns=0)
    assert mf.run_is_current(out, record, key)
    assert not mf.run_is_current(out, record, "another key")
    assert mf.run_key(argparse.Namespace(only=["tiny_b"], wide=False, images=[]))[0] != record

    # main() stops before building anything: no checkpoint appears.
    assert mf.main(["--out", str(out), "--only", "tiny_a"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert not (out / "tiny_a_torchscript.pt2").exists()

    # Rewritten with the same bytes (as another run rewrites the shared images): still current.
    written.write_bytes(b"labels")
    assert mf.run_is_current(out, record, key)
    # Changed or gone: built again.
    written.write_bytes(b"damaged")
    assert not mf.run_is_current(out, record, key)
    written.unlink()
    assert not mf.run_is_current(out, record, key)
