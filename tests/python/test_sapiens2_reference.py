"""Tests for the Sapiens2 reference (tests/reference/sapiens2.py) and the fixtures that
tests/fixtures/sapiens2.py writes (spec shared/spec/sapiens2.md §2-5, §8-10).

The fixtures folder comes from SAPIENS_SEG_FIXTURES (ctest sets it); the tests are skipped when
it is unset or holds no Sapiens2 fixtures. Build them with

    .venv/bin/python tests/fixtures/make_fixtures.py --out build/fixtures    (or --only s2_tiny)

Expected key sets, shapes, periods, RoPE tables and the forward pass are written out here from
the spec, independently of the reference code, so that a mistake in either shows up.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from reference import sapiens2 as s2  # noqa: E402

_ENV = os.environ.get("SAPIENS_SEG_FIXTURES")
FIX = Path(_ENV) if _ENV else None
if FIX is None:
    pytest.skip("SAPIENS_SEG_FIXTURES is not set", allow_module_level=True)
if not (FIX / "s2_tiny.safetensors").is_file():
    pytest.skip(f"no Sapiens2 fixtures in {FIX} (run tests/fixtures/make_fixtures.py --out {FIX})",
                allow_module_level=True)

# Spec §10 tiny configuration.
C, L, HEADS, HD, FF, KV_GQA = 80, 18, 4, 20, 320, 2
DECONV, CONV, K = (32, 16, 16, 8), (8, 8), 29
GQA_BLOCKS = {8, 9}
PERIODS = "backbone.rope_embed.periods"
BATCH = FIX / "ref" / "s2_tiny" / "batch_128x96"
MEAN = np.array([123.675, 116.28, 103.53], np.float32)
STD = np.array([58.395, 57.12, 57.375], np.float32)


def cfg() -> s2.Sapiens2Config:
    return s2.Sapiens2Config(C, L, HEADS, FF, DECONV, CONV, K)


# ---------------------------------------------------------------------------------------------
# safetensors read by hand: 8-byte little-endian header length, JSON header, data
# ---------------------------------------------------------------------------------------------

_NP = {"F32": np.float32, "I64": np.int64}


def header(path: Path) -> dict:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a file, BF16 widened to float32 (exact), without the safetensors lib."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        buf = data[a:b]
        if v["dtype"] == "BF16":
            u = np.frombuffer(buf, np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(buf, _NP[v["dtype"]])
        out[k] = torch.from_numpy(arr.reshape(v["shape"]).copy())
    return out


def expected() -> dict[str, list[int]]:
    """Spec §4.2/§4.3 for the tiny config, written out from the tables."""
    e = {
        "backbone.cls_token": [1, 1, C],
        "backbone.storage_tokens": [1, 8, C],
        "backbone.patch_embed.projection.weight": [C, 3, 16, 16],
        "backbone.patch_embed.projection.bias": [C],
        PERIODS: [HD // 4],
        "backbone.ln1.weight": [C],
        "decode_head.deconv_layers.0.weight": [C, 32, 4, 4],
        "decode_head.deconv_layers.3.weight": [32, 16, 4, 4],
        "decode_head.deconv_layers.6.weight": [16, 16, 4, 4],
        "decode_head.deconv_layers.9.weight": [16, 8, 4, 4],
        "decode_head.conv_layers.0.weight": [8, 8, 1, 1],
        "decode_head.conv_layers.0.bias": [8],
        "decode_head.conv_layers.3.weight": [8, 8, 1, 1],
        "decode_head.conv_layers.3.bias": [8],
        "decode_head.conv_seg.weight": [K, 8, 1, 1],
        "decode_head.conv_seg.bias": [K],
    }
    for i in range(L):
        kv = (KV_GQA if i in GQA_BLOCKS else HEADS) * HD
        p = f"backbone.blocks.{i}."
        e.update({p + "ln1.weight": [C], p + "ln2.weight": [C],
                  p + "attn.wq.weight": [C, C], p + "attn.wq.bias": [C],
                  p + "attn.wk.weight": [kv, C], p + "attn.wk.bias": [kv],
                  p + "attn.wv.weight": [kv, C], p + "attn.wv.bias": [kv],
                  p + "attn.proj.weight": [C, C], p + "attn.proj.bias": [C],
                  p + "attn.q_norm.weight": [HD], p + "attn.k_norm.weight": [HD],
                  p + "attn.gamma.weight": [C],
                  p + "ffn.w12.weight": [8 * C, C], p + "ffn.w12.bias": [8 * C],
                  p + "ffn.w3.weight": [C, 4 * C], p + "ffn.w3.bias": [C]})
    return e


@pytest.fixture(scope="module")
def sd() -> dict[str, torch.Tensor]:
    return tensors(FIX / "s2_tiny.safetensors")


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def test_key_set_shapes_and_dtypes():
    h = header(FIX / "s2_tiny.safetensors")
    assert h.pop("__metadata__") == {"format": "pt"}
    want = expected()
    assert len(want) == 17 * L + 6 + 10 == 322
    assert set(h) == set(want)
    for k, v in h.items():
        assert v["shape"] == want[k], k
        assert v["dtype"] == ("BF16" if k == PERIODS else "F32"), k
    gqa = {int(k.split(".")[2]) for k, v in h.items()
           if k.endswith("attn.wk.weight") and v["shape"][0] != C}
    assert gqa == GQA_BLOCKS
    assert gqa == set(cfg().gqa_layers())
    # The reference module has exactly these keys and shapes.
    m = s2.Sapiens2Seg(cfg())
    assert {k: list(v.shape) for k, v in m.state_dict().items()} == want
    assert s2.expected_shapes(cfg()) == {k: tuple(v) for k, v in want.items()}


def test_metadata_and_periods_variants(sd):
    h32 = header(FIX / "s2_tiny_f32periods.safetensors")
    hhf = header(FIX / "s2_tiny_hf.safetensors")
    assert h32.pop("__metadata__") == {"format": "pt"}
    assert hhf.pop("__metadata__") == {"format": "pt"}
    assert h32[PERIODS]["dtype"] == "F32"
    assert all(v["dtype"] == "F32" for v in h32.values())
    sd32 = tensors(FIX / "s2_tiny_f32periods.safetensors")
    assert sd32.keys() == sd.keys()
    for k in sd:
        assert torch.equal(sd32[k], sd[k]), k


def test_periods_values(sd):
    # 100 ** (2 j / (hd / 2)) with the exponent and the power rounded to bf16 by torch.
    j = torch.arange(HD // 4, dtype=torch.bfloat16)
    want = 100 ** (2 * j / (HD // 2))
    assert want.dtype == torch.bfloat16
    assert torch.equal(sd[PERIODS], want.float())
    assert torch.equal(s2.rope_periods(HD), want)
    # The ideal values differ by more than one rounding of the result: the bf16 exponent
    # error is multiplied by ln(100) (spec §2.5: up to ~0.6 %).
    ideal = torch.tensor([100 ** (2 * i / (HD / 2)) for i in range(HD // 4)], dtype=torch.float64)
    rel = (sd[PERIODS].double() - ideal).abs() / ideal
    assert 2 ** -9 < float(rel.max()) < 0.01
    assert not torch.equal(ideal.to(torch.bfloat16), want)
    # hd 64 (0.4b, 1b): the values listed in spec §2.5.
    spec64 = [1, 1.3359375, 1.78125, 2.375, 3.15625, 4.21875, 5.625, 7.5, 10, 13.3125, 17.75,
              23.75, 31.625, 42.25, 56.25, 75]
    assert s2.rope_periods(64).float().tolist() == spec64


def test_rope_table_8x6(sd):
    cos = np.load(BATCH / "rope_cos.npy")
    sin = np.load(BATCH / "rope_sin.npy")
    assert cos.shape == sin.shape == (48, HD) and cos.dtype == np.float32
    # The reference module rebuilds the same tables bit for bit (bf16 values).
    s_ref, c_ref = s2.rope_tables(s2.rope_periods(HD), 8, 6)
    assert s_ref.dtype == torch.bfloat16
    assert np.array_equal(c_ref.float().numpy(), cos) and np.array_equal(s_ref.float().numpy(), sin)
    # Independent float64 computation: token n = r * 6 + c, y = 2 (r + .5) / 8 - 1, x likewise
    # over 6; angle row [y / p_j for j] + [x / p_j for j], times 2 pi, tiled twice.
    per = sd[PERIODS].double().numpy()
    ang = np.zeros((48, HD))
    for r in range(8):
        for c in range(6):
            y, x = 2 * (r + 0.5) / 8 - 1, 2 * (c + 0.5) / 6 - 1
            row = np.concatenate([2 * math.pi * y / per, 2 * math.pi * x / per])
            ang[r * 6 + c] = np.tile(row, 2)
    # bf16 keeps 8 significant bits; the table went through ~5 roundings of that size.
    tol = 6 * 2.0 ** -9 * (np.abs(ang) + 1)
    assert np.all(np.abs(cos - np.cos(ang)) <= tol)
    assert np.all(np.abs(sin - np.sin(ang)) <= tol)
    # ... and it is not the fp32 table (so the bf16 path is really exercised).
    assert np.abs(cos - np.cos(ang)).max() > 1e-4
    # Values are bf16-representable.
    u = cos.view(np.uint32)
    assert np.all(u & 0xFFFF == 0)


def test_hf_conversion_round_trip(sd):
    hf = tensors(FIX / "s2_tiny_hf.safetensors")
    assert PERIODS not in hf and not any("periods" in k for k in hf)
    assert len(hf) == 322 - 1 + 2 * L  # w12 weight and bias each split in two
    for i in range(L):
        w12 = sd[f"backbone.blocks.{i}.ffn.w12.weight"]
        assert torch.equal(hf[f"model.layer.{i}.mlp.gate_proj.weight"], w12[:4 * C])
        assert torch.equal(hf[f"model.layer.{i}.mlp.up_proj.weight"], w12[4 * C:])
        b12 = sd[f"backbone.blocks.{i}.ffn.w12.bias"]
        assert torch.equal(hf[f"model.layer.{i}.mlp.gate_proj.bias"], b12[:4 * C])
        assert torch.equal(hf[f"model.layer.{i}.mlp.up_proj.bias"], b12[4 * C:])
        assert torch.equal(hf[f"model.layer.{i}.layer_scale1.lambda1"],
                           sd[f"backbone.blocks.{i}.attn.gamma.weight"])
        assert torch.equal(hf[f"model.layer.{i}.attention.o_proj.weight"],
                           sd[f"backbone.blocks.{i}.attn.proj.weight"])
    pairs = {
        "model.embeddings.cls_token": "backbone.cls_token",
        "model.embeddings.register_tokens": "backbone.storage_tokens",
        "model.embeddings.patch_embeddings.weight": "backbone.patch_embed.projection.weight",
        "model.norm.weight": "backbone.ln1.weight",
        "model.layer.8.attention.k_proj.weight": "backbone.blocks.8.attn.wk.weight",
        "model.layer.17.attention.k_norm.weight": "backbone.blocks.17.attn.k_norm.weight",
        "decode_head.upsample_layers.3.convolution.weight": "decode_head.deconv_layers.9.weight",
        "decode_head.conv_layers.1.convolution.bias": "decode_head.conv_layers.3.bias",
        "decode_head.predictor.weight": "decode_head.conv_seg.weight",
    }
    for a, b in pairs.items():
        assert torch.equal(hf[a], sd[b]), a
    # Both directions of the reference's converter, exactly.
    conv = s2.original_to_hf(sd)
    assert conv.keys() == hf.keys()
    assert all(torch.equal(conv[k], hf[k]) for k in hf)
    back = s2.hf_to_original(hf, head_dim=HD)
    assert back.keys() == sd.keys()
    assert back[PERIODS].dtype == torch.bfloat16
    assert all(torch.equal(back[k].float(), sd[k]) for k in sd)
    assert s2.hf_to_original(hf).keys() == sd.keys() - {PERIODS}


def test_broken_files(sd):
    want = expected()
    good = FIX / "s2_tiny.safetensors"

    h = header(FIX / "s2_broken_missing.safetensors")
    h.pop("__metadata__", None)
    assert set(want) - set(h) == {"backbone.blocks.3.attn.k_norm.weight"} and set(h) < set(want)

    h = header(FIX / "s2_broken_shape.safetensors")
    h.pop("__metadata__", None)
    assert set(h) == set(want)
    bad = {k for k in h if h[k]["shape"] != want[k]}
    assert bad == {"backbone.blocks.8.attn.wk.weight"}
    assert h["backbone.blocks.8.attn.wk.weight"]["shape"] == [C, C]
    assert want["backbone.blocks.8.attn.wk.weight"] == [C // 2, C]

    h = header(FIX / "s2_broken_unexpected.safetensors")
    h.pop("__metadata__", None)
    assert set(h) - set(want) == {"backbone.extra.weight"} and set(want) < set(h)
    assert h["backbone.extra.weight"]["shape"] == [C]

    h = header(FIX / "s2_broken_dtype.safetensors")
    h.pop("__metadata__", None)
    assert set(h) == set(want)
    assert {k for k, v in h.items() if v["dtype"] not in ("F32", "BF16")} == {"backbone.ln1.weight"}
    assert h["backbone.ln1.weight"]["dtype"] == "I64"

    raw = good.read_bytes()
    tr = (FIX / "s2_broken_truncated.safetensors").read_bytes()
    assert len(tr) == int(len(raw) * 0.6) and raw.startswith(tr)
    (n,) = struct.unpack("<Q", tr[:8])
    assert 8 + n < len(tr)  # the header is intact; the data is cut

    # The strict loader refuses each of them, and accepts the three good files.
    for name in ("missing", "shape", "unexpected", "dtype", "truncated"):
        with pytest.raises(Exception):
            s2.load_strict(FIX / f"s2_broken_{name}.safetensors", cfg())
    for name in ("s2_tiny", "s2_tiny_f32periods", "s2_tiny_hf"):
        s2.load_strict(FIX / f"{name}.safetensors", cfg())


def test_card():
    card = json.loads((FIX / "cards" / "s2_tiny.json").read_text())
    template = json.loads((REPO / "cards" / "sapiens2-seg-0.4b.json").read_text())
    assert set(card) == set(template)
    p = FIX / card["file"]
    assert card["file"] == "s2_tiny.safetensors"
    assert card["size"] == p.stat().st_size
    assert card["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert card["id"] == "s2-tiny" and card["family"] == template["family"]
    assert card["repo"] is None and card["revision"] is None and card["url"] is None
    assert card["hash_provenance"] == "generated by tests/fixtures/sapiens2.py"
    assert card["arch"] == {"patch": 16, "embed_dim": C, "depth": L, "heads": HEADS,
                            "kv_heads": KV_GQA, "mlp": FF, "head_channels": 32, "num_classes": K}
    assert card["license"] == template["license"] and "notice" in card["license"]
    assert card["labels"] == template["labels"] and card["labels"]["name"] == "dome-29"
    for k in ("format", "input", "preprocess", "schema"):
        assert card[k] == template[k], k


# ---------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------


def demo_input(stem: str, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Spec §5 written out: cv2 resize (AREA if the width shrinks, else CUBIC), BGR->RGB,
    (x - mean) / std. Returns (resized RGB uint8, input [3, h, w])."""
    name = "astronaut.jpg" if stem == "astronaut" else f"{stem}.png"
    img = cv2.imread(str(FIX / "images" / name), cv2.IMREAD_COLOR)
    assert img is not None
    interp = cv2.INTER_AREA if w < img.shape[1] else cv2.INTER_CUBIC
    rgb = cv2.resize(img, (w, h), interpolation=interp)[:, :, ::-1]
    x = (rgb.astype(np.float32) - MEAN) / STD
    return np.ascontiguousarray(rgb), np.ascontiguousarray(x.transpose(2, 0, 1))


def test_reference_files():
    shapes = {"input": (2, 3, 128, 96), "tokens": (2, 57, C), "rope_cos": (48, HD),
              "rope_sin": (48, HD), "final_norm": (2, 57, C), "featmap": (2, C, 8, 6),
              "head_0": (2, 32, 16, 12), "head_1": (2, 16, 32, 24), "head_2": (2, 16, 64, 48),
              "head_3": (2, 8, 128, 96), "head_4": (2, 8, 128, 96), "head_5": (2, 8, 128, 96),
              "logits": (2, K, 128, 96)}
    shapes.update({f"block_{i:02d}": (2, 57, C) for i in (0, 7, 8, 9, 17)})
    for name, shape in shapes.items():
        a = np.load(BATCH / f"{name}.npy")
        assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous, name
    stems = (BATCH / "stems.txt").read_text().split()
    assert stems == ["synth_300x211", "synth_landscape_480x640"]
    x = np.load(BATCH / "input.npy")
    for i, stem in enumerate(stems):
        assert np.array_equal(x[i], demo_input(stem, 128, 96)[1])

    for stem, (h0, w0) in (("synth_300x211", (300, 211)), ("synth_1080x1920", (1080, 1920)),
                           ("astronaut", (512, 512))):
        d = FIX / "ref" / "s2_tiny" / stem
        rgb, x = demo_input(stem, 1024, 768)
        r = np.load(d / "resized.npy")
        assert r.dtype == np.uint8 and r.shape == (1024, 768, 3) and np.array_equal(r, rgb)
        assert np.array_equal(np.load(d / "input.npy"), x[None])
        lg = np.load(d / "logits.npy", mmap_mode="r")
        assert lg.shape == (1, K, 1024, 768) and lg.dtype == np.float32
        lab = np.load(d / "labels.npy")
        gap = np.load(d / "top2_gap.npy")
        assert lab.shape == gap.shape == (h0, w0)
        assert lab.dtype == np.uint8 and gap.dtype == np.float32 and gap.min() >= 0
        assert len(np.unique(lab)) >= 3
        if h0 * w0 <= 512 * 512:  # post-processing recomputed from the logits (small only)
            up = F.interpolate(torch.from_numpy(np.array(lg)), size=(h0, w0), mode="bilinear",
                               align_corners=False)[0]
            assert np.array_equal(up.argmax(0).numpy().astype(np.uint8), lab)
            top = up.topk(2, dim=0).values
            assert np.allclose((top[0] - top[1]).numpy(), gap, atol=1e-6)
    d = FIX / "ref" / "s2_tiny" / "synth_300x211"
    assert np.load(d / "rope_cos.npy").shape == (3072, HD)
    assert np.load(d / "rope_sin.npy").shape == (3072, HD)
    for name in ("tokens", "block_08", "final_norm"):
        assert np.load(d / f"{name}.npy").shape == (1, 3081, C), name


# Per-tensor tolerances for a forward pass that differs from the reference run only in fp32
# rounding (another implementation, thread count or GEMM blocking): (mean, max) of |diff|,
# relative to the mean and the max magnitude. Where two fp32 paths differ in the last bits,
# the bf16 rounding of q/k can land one bf16 step apart; such flips are sparse and grow through
# the blocks, hence the mean-based check plus a loose bound on the maximum. With the spec's
# numerics the means are ~2e-7 (block 0), ~1.3e-4 (blocks 8-17) and ~4e-4 (logits); keeping
# the prefix tokens in fp32 or doing the RoPE products in fp32 (both close misreadings of spec
# §8.2) give >= 2.4e-4, >= 8e-4 and >= 2.8e-3.
TOLERANCES = {"tokens": (1e-7, 1e-6), "block_00": (5e-5, 2e-4), "block_07": (3e-4, 2e-3),
              "block_08": (3e-4, 2e-3), "block_09": (3e-4, 2e-3), "block_17": (3e-4, 2e-3),
              "final_norm": (3e-4, 2e-3), "featmap": (3e-4, 2e-3), "head_3": (1e-3, 5e-3),
              "logits": (1.2e-3, 5e-3)}


def assert_matches_batch(got: dict) -> None:
    for name, (mean_rel, max_rel) in TOLERANCES.items():
        want = np.load(BATCH / f"{name}.npy")
        g = got[name].float().numpy()
        assert g.shape == want.shape, name
        diff = np.abs(g - want)
        mean = float(diff.mean() / np.abs(want).mean())
        mx = float(diff.max() / max(float(np.abs(want).max()), 1.0))
        assert mean <= mean_rel and mx <= max_rel, f"{name}: mean {mean:.3g}, max {mx:.3g}"
    lab_got = got["logits"].argmax(1).numpy()
    lab_want = np.load(BATCH / "logits.npy").argmax(1)
    assert (lab_got == lab_want).mean() > 0.995


def test_reference_module_reproduces_batch():
    model = s2.load_strict(FIX / "s2_tiny.safetensors", cfg())
    trace: dict = {}
    with torch.no_grad():
        model(torch.from_numpy(np.load(BATCH / "input.npy")), trace)
    for name in ("tokens", "rope_cos", "rope_sin"):
        assert np.array_equal(trace[name].float().numpy(), np.load(BATCH / f"{name}.npy")), name
    assert_matches_batch(trace)


# ---------------------------------------------------------------------------------------------
# An independent functional forward from the spec (§2.3-2.5, §3, §8) on the batch input
# ---------------------------------------------------------------------------------------------


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def rope_bf16(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """All tokens rounded to bf16, the 48 patch tokens rotated: out[i] = t[i] cos - t[i+h] sin,
    out[i+h] = t[i+h] cos + t[i] sin, each product and the sum rounded to bf16."""
    t = t.to(torch.bfloat16)
    h = HD // 2
    p = t[:, :, 9:]
    a, b = p[..., :h], p[..., h:]
    ca, cb, sa, sb = cos[:, :h], cos[:, h:], sin[:, :h], sin[:, h:]
    top = (a * ca) + ((-b) * sa)
    bot = (b * cb) + (a * sb)
    return torch.cat([t[:, :, :9], torch.cat([top, bot], -1)], 2).float()


def functional_forward(sd: dict[str, torch.Tensor], x: torch.Tensor, cos, sin) -> dict:
    out = {}
    B = x.shape[0]
    pe = F.conv2d(x, sd["backbone.patch_embed.projection.weight"],
                  sd["backbone.patch_embed.projection.bias"], stride=16)
    hp, wp = pe.shape[2:]
    t = torch.cat([sd["backbone.cls_token"].expand(B, 1, C),
                   sd["backbone.storage_tokens"].expand(B, 8, C),
                   pe.flatten(2).transpose(1, 2)], 1)
    out["tokens"] = t
    n = t.shape[1]
    for i in range(L):
        p = f"backbone.blocks.{i}."
        g = lambda k: sd[p + k]  # noqa: E731
        xn = rms(t, g("ln1.weight"))
        kv = KV_GQA if i in GQA_BLOCKS else HEADS
        q = (xn @ g("attn.wq.weight").T + g("attn.wq.bias")).view(B, n, HEADS, HD).transpose(1, 2)
        k = (xn @ g("attn.wk.weight").T + g("attn.wk.bias")).view(B, n, kv, HD).transpose(1, 2)
        v = (xn @ g("attn.wv.weight").T + g("attn.wv.bias")).view(B, n, kv, HD).transpose(1, 2)
        q, k = rms(q, g("attn.q_norm.weight")), rms(k, g("attn.k_norm.weight"))
        # Query head h reads kv head h // (HEADS // kv).
        idx = torch.arange(HEADS) // (HEADS // kv)
        k, v = k[:, idx], v[:, idx]
        q, k = rope_bf16(q, cos, sin), rope_bf16(k, cos, sin)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD), -1) @ v
        att = att.transpose(1, 2).reshape(B, n, C)
        t = t + g("attn.gamma.weight") * (att @ g("attn.proj.weight").T + g("attn.proj.bias"))
        hn = rms(t, g("ln2.weight")) @ g("ffn.w12.weight").T + g("ffn.w12.bias")
        t = t + (F.silu(hn[..., :4 * C]) * hn[..., 4 * C:]) @ g("ffn.w3.weight").T \
            + g("ffn.w3.bias")
        out[f"block_{i:02d}"] = t
    t = rms(t, sd["backbone.ln1.weight"])
    out["final_norm"] = t
    f = t[:, 9:].reshape(B, hp, wp, C).permute(0, 3, 1, 2)
    out["featmap"] = f

    def inorm_silu(y):
        m = y.mean((2, 3), keepdim=True)
        var = y.var((2, 3), keepdim=True, unbiased=False)
        return F.silu((y - m) / torch.sqrt(var + 1e-5))

    for s, j in enumerate((0, 3, 6, 9)):
        f = inorm_silu(F.conv_transpose2d(f, sd[f"decode_head.deconv_layers.{j}.weight"],
                                          stride=2, padding=1))
        out[f"head_{s}"] = f
    for s, j in enumerate((0, 3)):
        f = inorm_silu(F.conv2d(f, sd[f"decode_head.conv_layers.{j}.weight"],
                                sd[f"decode_head.conv_layers.{j}.bias"]))
        out[f"head_{4 + s}"] = f
    out["logits"] = F.conv2d(f, sd["decode_head.conv_seg.weight"], sd["decode_head.conv_seg.bias"])
    return out


def test_independent_forward_matches_reference(sd):
    x = torch.from_numpy(np.load(BATCH / "input.npy"))
    cos = torch.from_numpy(np.load(BATCH / "rope_cos.npy")).to(torch.bfloat16)
    sin = torch.from_numpy(np.load(BATCH / "rope_sin.npy")).to(torch.bfloat16)
    with torch.no_grad():
        got = functional_forward(sd, x, cos, sin)
    assert_matches_batch(got)


# ---- full-size benchmark files, streamed (tests/fixtures/sapiens2.py --only s2_full_*) --------

def test_streamed_full_size_writer_is_byte_identical_to_safetensors(tmp_path):
    """write_streamed (used for the 20 GB 5B file, one tensor in memory at a time) writes the
    same bytes as the safetensors package's save_file of the same tensors, here at tiny size."""
    from fixtures import sapiens2 as s2f
    from safetensors.torch import save_file

    cfg = s2f.tiny_fixture().cfg
    streamed = tmp_path / "streamed.safetensors"
    s2f.write_streamed(streamed, cfg, seed=7, log=lambda *a: None)
    s2f.read_back_check(streamed, cfg)
    shapes = s2.expected_shapes(cfg)
    order = sorted(shapes, key=lambda k: (-(4 if k != s2.PERIODS_KEY else 2), k))
    sd = {k: s2f.full_tensor(k, shapes[k], cfg, 7 * 100003 + i).contiguous()
          for i, k in enumerate(order)}
    ref = tmp_path / "ref.safetensors"
    save_file(sd, str(ref), metadata={"format": "pt"})
    assert streamed.read_bytes() == ref.read_bytes()
    model = s2.load_strict(streamed, cfg)  # the strict loader takes it
    assert model.backbone.rope_embed.periods.dtype == torch.bfloat16
    # Every parameter got a rule of its own (none left at a constant).
    for k, t in sd.items():
        if k != s2.PERIODS_KEY:
            assert float(t.std()) > 0, k


def test_full_size_configs_are_the_released_shapes():
    from fixtures import sapiens2 as s2f

    counts = {"0.4b": 406_601_693, "0.8b": 827_531_997, "1b": 1_470_819_805,
              "5b": 5_089_588_637}  # spec sapiens2.md section 4.5
    for name, size in s2f.FULL_SIZES.items():
        cfg = s2.Sapiens2Config.real(size)
        shapes = s2.expected_shapes(cfg)
        n = sum(math.prod(v) for k, v in shapes.items() if k != s2.PERIODS_KEY)
        assert n == counts[size], name
        assert len(shapes) == 17 * cfg.depth + 16
