#!/usr/bin/env python3
"""Build random-weight Sapiens v1 segmentation fixtures for the sapiens-seg tests.

The real Sapiens-Lite checkpoints (0.3B-2B parameters, 1.3-8.7 GB) are far too large to be
test inputs and need a download, so they cannot be part of ordinary test runs. The tests
therefore use small models that have *exactly* the structure of the real files: the same
state-dict key names, the same tensor layouts, the same TorchScript export path (a CPU trace
of the whole model at batch 1), and only the widths and depths shrunk. Everything the C++
library does with a real checkpoint (load by parameter name, check shapes, run the forward
pass, post-process) can then be checked against these fixtures, with PyTorch itself as the
reference.

All architecture facts (module tree, key names, norms, attention, head, pre/post-processing,
export procedure) come from the project's network spec, shared/spec/sapiens_v1.md (sections 1,
2, 3, 5.1, 8 and 10); the code below is written from that spec alone.

Output layout under --out DIR:

    tiny_a_torchscript.pt2, tiny_b_torchscript.pt2 [, wide_0.3b_torchscript.pt2 with --wide]
    broken_*.pt2                  damaged variants of tiny_a, one per loader failure mode
    tiny_a_deflated.pt2           tiny_a re-zipped with ZIP_DEFLATED (valid: torch reads it)
    cards/<fixture>.json          model cards (nlohmann/json schema 1), plus broken-wrong-hash.json
    images/synth_*.png            deterministic synthetic test images
    images/<example>.jpg|png      copies of the real photos used (examples/ and --images)
    ref/<fixture>/<stem>/*.npy    reference outputs of the Sapiens-Lite demo pipeline per image:
                                  resized (uint8 BGR), input (fp32 [3,H,W]), logits (fp32
                                  [28,h,w]), labels (uint8 [H0,W0]), top2_gap (fp32 [H0,W0])
    ref/<fixture>/batch/          logits.npy of the first two images run as one batch, and
                                  stems.txt naming them

Usage:
    python tools/make_fixtures.py --out build/fixtures [--wide] [--images IMG ...]

The module can be imported without side effects (`from make_fixtures import SapiensV1Seg`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
import warnings
import zipfile
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------------
# Constants from the spec
# ---------------------------------------------------------------------------------------------

PATCH = 16
NUM_CLASSES = 28

# Normalisation (0-255 scale, RGB order). The training config values live in the model's
# data_preprocessor buffers; the Sapiens-Lite demo, which the references reproduce, uses the
# rounded values (spec §5.1, §5.3).
MEAN_TRAIN = (123.675, 116.28, 103.53)
STD_TRAIN = (58.395, 57.12, 57.375)
MEAN_LITE = (123.5, 116.5, 103.5)
STD_LITE = (58.5, 57.0, 57.5)

# Goliath-28 classes and RGB palette (spec §6), read from the project's own model card so the
# fixtures and the bundled cards can never disagree.
_CARD = Path(__file__).resolve().parents[1] / "cards" / "sapiens-seg-0.3b-goliath.json"
with open(_CARD, encoding="utf-8") as _f:
    _LABELS = json.load(_f)["labels"]
CLASSES = list(_LABELS["classes"])
PALETTE = [list(c) for c in _LABELS["palette"]]
assert len(CLASSES) == NUM_CLASSES and len(PALETTE) == NUM_CLASSES


class FixtureError(RuntimeError):
    """A self-check failed; the fixtures must not be used."""


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise FixtureError(msg)


# ---------------------------------------------------------------------------------------------
# Fixture configurations (spec §10, plus a 0.3B-width variant for kernel shapes)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FixtureConfig:
    name: str
    card_id: str
    description: str
    embed_dim: int  # C
    depth: int  # L
    heads: int
    mlp: int  # F
    head_channels: int  # HC (768 in the real models)
    height: int  # traced input H
    width: int  # traced input W
    seed: int  # weight seed; fixed so the files are reproducible

    @property
    def grid(self) -> tuple[int, int]:
        return self.height // PATCH, self.width // PATCH

    @property
    def file_name(self) -> str:
        return f"{self.name}_torchscript.pt2"


FIXTURES: dict[str, FixtureConfig] = {
    c.name: c
    for c in (
        # Fast fixture for key names and structure (head_dim 32, grid 16x12).
        FixtureConfig("tiny_a", "fixture-tiny-a", "random-weight Tiny-A fixture (test only)",
                      64, 2, 2, 256, 32, 256, 192, seed=1001),
        # Real input size and real head_dim 64, so kernels see realistic shapes.
        FixtureConfig("tiny_b", "fixture-tiny-b", "random-weight Tiny-B fixture (test only)",
                      128, 2, 2, 512, 64, 1024, 768, seed=1002),
        # 0.3B widths (C 1024, 16 heads, head 768 channels) with only 2 blocks.
        FixtureConfig("wide_0.3b", "fixture-wide-0.3b",
                      "random-weight 0.3B-width fixture, 2 blocks (test only)",
                      1024, 2, 16, 4096, 768, 1024, 768, seed=1003),
        # The full 0.3B shape (24 blocks, ~1.36 GB), for the speed check only: built on demand
        # with --only full_0.3b, never by the tests.
        FixtureConfig("full_0.3b", "fixture-full-0.3b",
                      "random-weight full-size 0.3B-shape fixture, 24 blocks (benchmarks only)",
                      1024, 24, 16, 4096, 768, 1024, 768, seed=1004),
    )
}
DEFAULT_FIXTURES = ("tiny_a", "tiny_b")


# ---------------------------------------------------------------------------------------------
# Model: module tree mirrors the authors' EncoderDecoder so state-dict keys match (spec §3)
# ---------------------------------------------------------------------------------------------


class SegDataPreProcessor(nn.Module):
    """Holds the training mean/std as non-persistent buffers. Never called by forward (the
    traced model takes normalised input), but TorchScript serialises the buffers, so a loader
    sees `data_preprocessor.mean/std` exactly as in the real files (spec §3.2)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(MEAN_TRAIN).view(3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(STD_TRAIN).view(3, 1, 1), persistent=False)


class DropPath(nn.Module):
    """Stochastic depth with rate 0 (the configs use drop_path_rate=0): an identity."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class PatchEmbed(nn.Module):
    """Conv2d(3, C, 16, stride 16) then flatten to tokens [B, h*w, C] (token n = row*w + col).

    The authors' AdaptivePadding submodule has no tensors and is a no-op for multiples of 16;
    it is omitted (spec §10 allows this)."""

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(3, embed_dim, kernel_size=PATCH, stride=PATCH, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x).flatten(2).transpose(1, 2)


class MultiheadAttention(nn.Module):
    """Fused-qkv attention; rows of qkv.weight are [Q; K; V], each head-major."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.embed_dims = embed_dim
        self.num_heads = num_heads
        self.head_dims = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=True)
        self.proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.proj_drop = nn.Dropout(0.0)
        self.out_drop = DropPath()
        self.gamma1 = nn.Identity()  # no LayerScale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each [B, heads, N, hd]
        x = F.scaled_dot_product_attention(q, k, v)  # default scale 1/sqrt(hd), no mask
        x = x.transpose(1, 2).reshape(b, n, self.embed_dims)
        x = self.proj(x)
        return self.out_drop(self.gamma1(self.proj_drop(x)))


class FFN(nn.Module):
    """Linear(C,F) -> exact GELU -> Linear(F,C), nested so keys are layers.0.0.* / layers.1.*;
    adds the residual itself, as the authors' FFN does."""

    def __init__(self, embed_dim: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), nn.Dropout(0.0)),
            nn.Linear(hidden, embed_dim),
            nn.Dropout(0.0),
        )
        self.dropout_layer = nn.Identity()
        self.gamma2 = nn.Identity()

    def forward(self, x: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
        return identity + self.dropout_layer(self.gamma2(self.layers(x)))


class TransformerEncoderLayer(nn.Module):
    """Pre-norm ViT block: x += attn(ln1(x)); x += ffn(ln2(x))."""

    def __init__(self, embed_dim: int, num_heads: int, hidden: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.attn = MultiheadAttention(embed_dim, num_heads)
        self.ln2 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ffn = FFN(embed_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return self.ffn(self.ln2(x), identity=x)


class VisionTransformer(nn.Module):
    """ViT backbone without cls token, returning the last block's feature map [B, C, h, w]."""

    def __init__(self, embed_dim: int, depth: int, num_heads: int, hidden: int,
                 grid: tuple[int, int]) -> None:
        super().__init__()
        self.embed_dims = embed_dim
        # Own parameter first, as in the authors' module (it precedes patch_embed in the keys).
        self.pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dim))
        self.patch_embed = PatchEmbed(embed_dim)
        self.drop_after_pos = nn.Dropout(0.0)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(embed_dim, num_heads, hidden) for _ in range(depth))
        self.pre_norm = nn.Identity()
        self.ln1 = nn.LayerNorm(embed_dim, eps=1e-6)  # final norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h, w = x.shape[2] // PATCH, x.shape[3] // PATCH
        x = self.patch_embed(x)
        # Added directly: the real trace records no pos_embed interpolation (spec §4.3), so
        # the fixture, like the real file, only runs at its traced grid.
        x = self.drop_after_pos(x + self.pos_embed)
        x = self.pre_norm(x)
        for layer in self.layers:
            x = layer(x)
        x = self.ln1(x)
        return x.reshape(b, h, w, self.embed_dims).permute(0, 3, 1, 2)


class VitHead(nn.Module):
    """3x [deconv k4 s2 p1 (no bias), InstanceNorm2d, SiLU], 3x [1x1 conv, IN, SiLU], then
    Dropout2d + conv_seg. Output is 8x the token grid, i.e. half the input size."""

    def __init__(self, in_channels: int, channels: int, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        # Registration order reproduces the authors' key order: the base decode head creates
        # loss_decode, conv_seg and dropout before VitHead adds its own layers (spec §3.1).
        self.loss_decode = nn.Module()  # CrossEntropyLoss in the original; holds no tensors
        self.conv_seg = nn.Conv2d(channels, num_classes, kernel_size=1)
        self.dropout = nn.Dropout2d(0.1)
        deconvs: list[nn.Module] = []
        c_in = in_channels
        for _ in range(3):
            deconvs += [
                nn.ConvTranspose2d(c_in, channels, kernel_size=4, stride=2, padding=1,
                                   output_padding=0, bias=False),
                nn.InstanceNorm2d(channels),
                nn.SiLU(inplace=True),
            ]
            c_in = channels
        self.deconv_layers = nn.Sequential(*deconvs)
        convs: list[nn.Module] = []
        for _ in range(3):
            convs += [
                nn.Conv2d(channels, channels, kernel_size=1, bias=True),
                nn.InstanceNorm2d(channels),
                nn.SiLU(inplace=True),
            ]
        self.conv_layers = nn.Sequential(*convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.deconv_layers(x)
        x = self.conv_layers(x)
        return self.conv_seg(self.dropout(x))


class SapiensV1Seg(nn.Module):
    """Stand-in for mmseg's EncoderDecoder: normalised RGB [B,3,H,W] -> logits [B,28,H/2,W/2].

    The data preprocessor is a submodule but, as in the authors' trace, not part of forward."""

    def __init__(self, embed_dim: int, depth: int, num_heads: int, mlp: int,
                 head_channels: int, grid: tuple[int, int],
                 num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.data_preprocessor = SegDataPreProcessor()
        self.backbone = VisionTransformer(embed_dim, depth, num_heads, mlp, grid)
        self.decode_head = VitHead(embed_dim, head_channels, num_classes)

    @classmethod
    def from_config(cls, cfg: FixtureConfig) -> "SapiensV1Seg":
        return cls(cfg.embed_dim, cfg.depth, cfg.heads, cfg.mlp, cfg.head_channels, cfg.grid)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.decode_head(self.backbone(inputs))


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


# ConvTranspose2d(k=4, s=2, p=1) with this kernel is exact 2x bilinear upsampling
# (align_corners=False); see randomize_ for why the head's deconvs start from it.
BILINEAR_2X = torch.outer(torch.tensor([0.25, 0.75, 0.75, 0.25]),
                          torch.tensor([0.25, 0.75, 0.75, 0.25]))
DECONV_NOISE = 0.05  # relative size of the i.i.d. part of each deconv kernel


def randomize_(model: nn.Module, seed: int) -> None:
    """Fill every parameter from a seeded generator.

    Random rather than default init so that a C++ loader which swaps, transposes or skips a
    tensor produces visibly different logits: default init would leave LayerNorm at 1/0 and
    biases at 0, hiding exactly those bugs. The scales keep activations O(1) through the
    residual stream and give the logits a spread wide enough for stable argmax labels.

    The deconv kernels are the one structured exception. With i.i.d. kernels every output
    phase of each 2x stage gets an unrelated filter, and InstanceNorm (which removes each
    channel's mean and rescales what is left) turns that into an 8x8 phase pattern that
    dominates the logits: labels become salt-and-pepper noise unrelated to the image. Trained
    deconvs are smooth, so each kernel here is a random channel mix times the bilinear 2x kernel,
    plus a small i.i.d. part that keeps every tap distinct and the kernel asymmetric (a port
    that flips or transposes it still gets different logits). Labels then form image-driven
    regions, which is what the post-processing tests want to compare.
    """
    g = torch.Generator().manual_seed(seed)

    def normal(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32) * std + mean)

    seen = set()
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            for p_name, p in mod.named_parameters(recurse=False):
                full = f"{mod_name}.{p_name}" if mod_name else p_name
                if full == "backbone.pos_embed":
                    normal(p, 0.1)
                elif isinstance(mod, nn.LayerNorm) and p_name == "weight":
                    normal(p, 0.1, mean=1.0)
                elif isinstance(mod, nn.LayerNorm) and p_name == "bias":
                    normal(p, 0.05)
                elif full == "decode_head.conv_seg.weight":
                    normal(p, 1.0 / math.sqrt(p.shape[1]))
                elif full == "decode_head.conv_seg.bias":
                    normal(p, 0.1)
                elif isinstance(mod, nn.ConvTranspose2d) and p_name == "weight":
                    # [in, out, 4, 4], stride 2, padding 1: the bilinear taps of each output
                    # phase sum to 1, so the mix M with std 1/sqrt(in) keeps the output O(1).
                    c_in, c_out = p.shape[:2]
                    mix = torch.randn(c_in, c_out, generator=g) / math.sqrt(c_in)
                    noise = torch.randn(p.shape, generator=g) / math.sqrt(c_in * 4)
                    p.copy_(mix[:, :, None, None] * BILINEAR_2X + DECONV_NOISE * noise)
                elif isinstance(mod, (nn.Linear, nn.Conv2d)) and p_name == "weight":
                    normal(p, 1.0 / math.sqrt(p[0].numel()))  # fan_in
                elif isinstance(mod, (nn.Linear, nn.Conv2d)) and p_name == "bias":
                    normal(p, 0.05)
                else:
                    raise FixtureError(f"no initialisation rule for parameter {full}")
                seen.add(full)
    missing = {n for n, _ in model.named_parameters()} - seen
    check(not missing, f"parameters left at default init: {sorted(missing)}")


def build_model(cfg: FixtureConfig) -> SapiensV1Seg:
    """The eager fixture model, randomised with the fixture's seed, in eval mode."""
    model = SapiensV1Seg.from_config(cfg)
    randomize_(model, cfg.seed)
    for i in (0, 3, 6):
        w = model.decode_head.deconv_layers[i].weight.detach()
        asym = float((w - w.flip(2, 3)).norm() / w.norm())
        check(asym > 0.02, f"{cfg.name}: deconv_layers.{i} kernel is nearly symmetric ({asym})")
    return model.eval()


def expected_entries(cfg: FixtureConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The spec §3.2 key template (parameters then buffers are listed separately by TorchScript;
    here in eager state-dict order, buffers first). Independent of the module code above."""
    c, f, hc, k = cfg.embed_dim, cfg.mlp, cfg.head_channels, NUM_CLASSES
    n = cfg.grid[0] * cfg.grid[1]
    out: list[tuple[str, tuple[int, ...]]] = [
        ("data_preprocessor.mean", (3, 1, 1)),
        ("data_preprocessor.std", (3, 1, 1)),
        ("backbone.pos_embed", (1, n, c)),
        ("backbone.patch_embed.projection.weight", (c, 3, PATCH, PATCH)),
        ("backbone.patch_embed.projection.bias", (c,)),
    ]
    for i in range(cfg.depth):
        p = f"backbone.layers.{i}."
        out += [
            (p + "ln1.weight", (c,)), (p + "ln1.bias", (c,)),
            (p + "attn.qkv.weight", (3 * c, c)), (p + "attn.qkv.bias", (3 * c,)),
            (p + "attn.proj.weight", (c, c)), (p + "attn.proj.bias", (c,)),
            (p + "ln2.weight", (c,)), (p + "ln2.bias", (c,)),
            (p + "ffn.layers.0.0.weight", (f, c)), (p + "ffn.layers.0.0.bias", (f,)),
            (p + "ffn.layers.1.weight", (c, f)), (p + "ffn.layers.1.bias", (c,)),
        ]
    out += [
        ("backbone.ln1.weight", (c,)), ("backbone.ln1.bias", (c,)),
        ("decode_head.conv_seg.weight", (k, hc, 1, 1)), ("decode_head.conv_seg.bias", (k,)),
        ("decode_head.deconv_layers.0.weight", (c, hc, 4, 4)),
        ("decode_head.deconv_layers.3.weight", (hc, hc, 4, 4)),
        ("decode_head.deconv_layers.6.weight", (hc, hc, 4, 4)),
    ]
    for j in (0, 3, 6):
        out += [(f"decode_head.conv_layers.{j}.weight", (hc, hc, 1, 1)),
                (f"decode_head.conv_layers.{j}.bias", (hc,))]
    return out


def module_entries(m: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """Buffers then parameters with shapes, for eager modules and loaded ScriptModules alike."""
    return ([(n, tuple(b.shape)) for n, b in m.named_buffers()]
            + [(n, tuple(p.shape)) for n, p in m.named_parameters()])


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------


def example_input(cfg: FixtureConfig, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """The authors' dummy input: uniform [0,1) from RandomState(0), float32."""
    x = np.random.RandomState(seed).rand(batch, 3, cfg.height, cfg.width).astype(np.float32)
    return torch.from_numpy(x)


def trace_and_save(model: nn.Module, cfg: FixtureConfig, path: Path) -> None:
    """Trace as the authors' export did: eval mode, CPU, float32, batch 1, at the fixture's
    input size. The batch dimension stays dynamic (shapes become aten::size in the graph), but
    H and W, and with them pos_embed's grid, are frozen, exactly like the real files.

    The authors also set requires_grad on the dummy input and traced with autograd on; that
    records the same ops, so we trace under no_grad to keep the wide fixture's memory low.

    The bytes are reproducible run to run, but the archive's debug info (*.debug_pkl) records
    the absolute path and source ranges of this file and of torch's own modules, so editing
    this file, moving the checkout or changing the torch install changes the files' sha256.
    That is why the cards are rewritten on every run, next to the files they describe."""
    model = model.eval().cpu().float()
    with torch.no_grad(), warnings.catch_warnings():
        # InstanceNorm's input-size check warns that it is frozen into the trace; the authors'
        # trace freezes it the same way and it cannot fail at the traced size.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, example_input(cfg), check_trace=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    traced.save(str(path))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def verify_export(model: nn.Module, cfg: FixtureConfig, path: Path) -> dict:
    """Reload the file and check keys, output shape, eager == loaded, batch 2 == 2x batch 1."""
    loaded = torch.jit.load(str(path), map_location="cpu")
    got = module_entries(loaded)
    want = expected_entries(cfg)
    check(sorted(got) == sorted(want),
          f"{path.name}: key set differs from the spec template: "
          f"extra {sorted(set(got) - set(want))}, missing {sorted(set(want) - set(got))}")
    check(module_entries(model) == want,
          f"{path.name}: eager module entries are not in spec state-dict order")
    check(all(p.dtype == torch.float32 for _, p in loaded.named_parameters()),
          f"{path.name}: non-float32 parameter")

    h2, w2 = cfg.height // 2, cfg.width // 2
    x1 = example_input(cfg)
    x2 = torch.cat([x1, example_input(cfg, seed=1)])
    with torch.no_grad():
        y_eager = model(x1)
        y1 = loaded(x1)
        y2 = loaded(x2)
        y2b = loaded(x2[1:2])
    check(tuple(y1.shape) == (1, NUM_CLASSES, h2, w2), f"{path.name}: output {tuple(y1.shape)}")
    check(tuple(y2.shape) == (2, NUM_CLASSES, h2, w2), f"{path.name}: batch-2 {tuple(y2.shape)}")
    scale = float(y1.abs().max())
    d_eager = max_abs_diff(y_eager, y1)
    d_batch = max(max_abs_diff(y2[0:1], y1), max_abs_diff(y2[1:2], y2b))
    # The loaded graph runs the same kernels as the eager model, so this is normally exactly 0;
    # batch 2 may pick different GEMM blockings, hence a small relative tolerance.
    check(d_eager <= 1e-5 * max(scale, 1.0), f"{path.name}: loaded != eager (max diff {d_eager})")
    check(d_batch <= 1e-4 * max(scale, 1.0),
          f"{path.name}: batch 2 != batch 1 (max diff {d_batch})")
    return {"max_abs_logit": scale, "diff_eager": d_eager, "diff_batch": d_batch,
            "entries": len(got)}


def build_fixture(name: str, out_dir: Path) -> tuple[FixtureConfig, SapiensV1Seg, Path, dict]:
    """Build, trace, save and verify one fixture. Returns (cfg, eager model, file, check info)."""
    cfg = FIXTURES[name]
    model = build_model(cfg)
    path = Path(out_dir) / cfg.file_name
    trace_and_save(model, cfg, path)
    info = verify_export(model, cfg, path)
    return cfg, model, path, info


# ---------------------------------------------------------------------------------------------
# Broken variants of tiny_a (each one a distinct loader failure)
# ---------------------------------------------------------------------------------------------

BROKEN_FILES = (
    "broken_truncated.pt2", "broken_not_zip.pt2", "broken_missing_tensor.pt2",
    "broken_unexpected_tensor.pt2", "broken_wrong_shape.pt2", "broken_wrong_dtype.pt2",
    "broken_flipped_byte.pt2",
)
# Not broken: tiny_a re-zipped with ZIP_DEFLATED (torch.jit.load reads it; the C++ reader must).
DEFLATED_FILE = "tiny_a_deflated.pt2"


def _record_data_offset(blob: bytes, info: zipfile.ZipInfo) -> int:
    """Where a record's bytes start: after its local header, whose extra field (torch pads it
    to align the data) may differ in length from the central directory's."""
    h = info.header_offset
    check(blob[h:h + 4] == b"PK\x03\x04", f"no local header for {info.filename}")
    name_len = int.from_bytes(blob[h + 26:h + 28], "little")
    extra_len = int.from_bytes(blob[h + 28:h + 30], "little")
    return h + 30 + name_len + extra_len


def write_flipped_byte(tiny_a_path: Path, path: Path) -> str:
    """tiny_a with one bit flipped in the middle of the largest tensor record: torch.jit.load
    reads it without complaint (it checks no CRC), so only the record's CRC-32 can tell.
    Returns the record's name."""
    blob = bytearray(tiny_a_path.read_bytes())
    with zipfile.ZipFile(tiny_a_path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    check(info.compress_type == zipfile.ZIP_STORED, f"{info.filename} is not stored")
    blob[_record_data_offset(bytes(blob), info) + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(blob))
    return info.filename


def write_deflated(tiny_a_path: Path, path: Path) -> None:
    """Every record of tiny_a, same names and order, re-written by Python's zipfile with
    ZIP_DEFLATED (what `zip -r` or a repackaging tool does to an archive)."""
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tiny_a_path) as src, \
            zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(path)
    with zipfile.ZipFile(path) as z:
        check(all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist()),
              f"{path.name}: a record is not deflated")
        check(z.testzip() is None, f"{path.name}: a record fails its CRC")


def _probe(path: Path, cfg: FixtureConfig) -> dict:
    """What torch does with a file: does it load, what does it hold, does forward run."""
    res: dict = {"loads": False, "runs": False, "error": None, "entries": None, "dtypes": None}
    try:
        m = torch.jit.load(str(path), map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any failure is the expected outcome for some files
        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:100]}"
        return res
    res["loads"] = True
    res["entries"] = module_entries(m)
    res["dtypes"] = {n: p.dtype for n, p in m.named_parameters()}
    try:
        with torch.no_grad():
            y = m(example_input(cfg))
        res["runs"] = tuple(y.shape) == (1, NUM_CLASSES, cfg.height // 2, cfg.width // 2)
    except Exception as e:  # noqa: BLE001
        # TorchScript errors end with the original "RuntimeError: ..." line.
        res["error"] = f"forward: {str(e).strip().splitlines()[-1][:110]}"
    return res


def write_broken_variants(model_a: SapiensV1Seg, cfg_a: FixtureConfig, tiny_a_path: Path,
                          out_dir: Path) -> list[tuple[Path, str]]:
    """Write the broken_*.pt2 files and verify each is broken in the way its name says.
    Returns (path, one-line summary) per file."""
    out_dir = Path(out_dir)
    c = cfg_a.embed_dim
    good = tiny_a_path.read_bytes()
    want = set(expected_entries(cfg_a))

    # Truncated archive: the zip central directory (at the end) is gone.
    p_trunc = out_dir / "broken_truncated.pt2"
    p_trunc.write_bytes(good[: int(len(good) * 0.6)])

    # Not a zip at all.
    p_text = out_dir / "broken_not_zip.pt2"
    line = "this is not a TorchScript archive, just plain text for the loader tests.\n"
    p_text.write_text(line * 64)

    # A structurally valid model lacking one tensor: conv_layers.0 rebuilt without bias.
    p_missing = out_dir / "broken_missing_tensor.pt2"
    m = copy.deepcopy(model_a)
    old = m.decode_head.conv_layers[0]
    new = nn.Conv2d(old.in_channels, old.out_channels, kernel_size=1, bias=False)
    with torch.no_grad():
        new.weight.copy_(old.weight)
    m.decode_head.conv_layers[0] = new
    trace_and_save(m, cfg_a, p_missing)

    # One extra registered (unused) tensor: a cls token the real models do not have.
    p_extra = out_dir / "broken_unexpected_tensor.pt2"
    m = copy.deepcopy(model_a)
    m.backbone.cls_token = nn.Parameter(
        torch.randn(1, 1, c, generator=torch.Generator().manual_seed(7)))
    trace_and_save(m, cfg_a, p_extra)

    # Wrong shape / wrong dtype: replace a parameter of the *traced* tiny_a after tracing.
    # A ScriptModule accepts any Tensor for a Tensor attribute (shape and dtype are not part of
    # its type), so setattr works and the graph keeps expecting the original shape/dtype.
    # ModuleList children of a loaded ScriptModule are reached with getattr(..., "1").
    p_shape = out_dir / "broken_wrong_shape.pt2"
    ts = torch.jit.load(str(tiny_a_path), map_location="cpu")
    ln2 = getattr(ts.backbone.layers, "1").ln2
    ln2.weight = nn.Parameter(torch.cat([ln2.weight.detach(), torch.ones(1)]))
    ts.save(str(p_shape))

    p_dtype = out_dir / "broken_wrong_dtype.pt2"
    ts = torch.jit.load(str(tiny_a_path), map_location="cpu")
    ts.backbone.ln1.weight = nn.Parameter(ts.backbone.ln1.weight.detach().double())
    ts.save(str(p_dtype))

    p_flip = out_dir / "broken_flipped_byte.pt2"
    flipped = write_flipped_byte(tiny_a_path, p_flip)

    summaries: list[tuple[Path, str]] = []

    # Verify each variant against what its name claims.
    # torch reports both as "failed finding central directory"; a loader tells them apart by
    # the leading zip signature, which only the truncated file still has.
    for path, is_zip_start in ((p_trunc, True), (p_text, False)):
        r = _probe(path, cfg_a)
        check(not r["loads"], f"{path.name}: torch.jit.load unexpectedly succeeded")
        check(not zipfile.is_zipfile(path), f"{path.name}: is still a readable zip")
        check(path.read_bytes()[:4] == b"PK\x03\x04" if is_zip_start
              else not path.read_bytes().startswith(b"PK"), f"{path.name}: wrong leading bytes")
        what = "zip signature but no central directory" if is_zip_start else "no zip signature"
        summaries.append((path, f"{what}; load fails ({r['error']})"))

    r = _probe(p_missing, cfg_a)
    got = set(r["entries"] or [])
    check(r["loads"] and r["runs"], f"{p_missing.name}: should load and run ({r['error']})")
    check(want - got == {("decode_head.conv_layers.0.bias", (cfg_a.head_channels,))}
          and got <= want, f"{p_missing.name}: wrong key difference {sorted(want ^ got)}")
    summaries.append((p_missing, "loads and runs; missing decode_head.conv_layers.0.bias"))

    r = _probe(p_extra, cfg_a)
    got = set(r["entries"] or [])
    check(r["loads"] and r["runs"], f"{p_extra.name}: should load and run ({r['error']})")
    check(got - want == {("backbone.cls_token", (1, 1, c))} and want <= got,
          f"{p_extra.name}: wrong key difference {sorted(want ^ got)}")
    summaries.append((p_extra, f"loads and runs; extra backbone.cls_token [1,1,{c}]"))

    r = _probe(p_shape, cfg_a)
    ents = dict(r["entries"] or [])
    check(r["loads"], f"{p_shape.name}: should load ({r['error']})")
    check(ents.get("backbone.layers.1.ln2.weight") == (c + 1,),
          f"{p_shape.name}: saved ln2.weight shape {ents.get('backbone.layers.1.ln2.weight')}")
    check(set(ents) == {n for n, _ in want}, f"{p_shape.name}: key set changed")
    check(not r["runs"], f"{p_shape.name}: forward unexpectedly ran")
    summaries.append((p_shape, f"loads; backbone.layers.1.ln2.weight is [{c + 1}]; "
                               f"forward fails ({r['error']})"))

    r = _probe(p_dtype, cfg_a)
    check(r["loads"], f"{p_dtype.name}: should load ({r['error']})")
    bad = {n for n, d in (r["dtypes"] or {}).items() if d != torch.float32}
    check(bad == {"backbone.ln1.weight"}
          and r["dtypes"]["backbone.ln1.weight"] == torch.float64,
          f"{p_dtype.name}: non-float32 parameters are {sorted(bad)}")
    check(set(r["entries"]) == want, f"{p_dtype.name}: key set or shapes changed")
    fwd = "forward fails" if not r["runs"] else "forward still runs"
    summaries.append((p_dtype, f"loads; backbone.ln1.weight is float64; {fwd}"
                               + (f" ({r['error']})" if r["error"] else "")))

    r = _probe(p_flip, cfg_a)
    check(r["loads"] and r["runs"], f"{p_flip.name}: torch should load and run it ({r['error']})")
    with zipfile.ZipFile(p_flip) as z:
        check(z.testzip() == flipped, f"{p_flip.name}: zipfile does not see the bad CRC")
    summaries.append((p_flip, f"torch loads and runs it; {flipped} fails its CRC-32"))
    return summaries


# ---------------------------------------------------------------------------------------------
# Cards
# ---------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_card(cfg: FixtureConfig, model_path: Path) -> dict:
    return {
        "schema": 1,
        "id": cfg.card_id,
        "family": "sapiens-v1",
        "description": cfg.description,
        "repo": None,
        "revision": None,
        "url": None,
        "file": model_path.name,
        "size": model_path.stat().st_size,
        "sha256": sha256_file(model_path),
        "license": {"id": "Apache-2.0", "commercial_use": True, "url": None},
        "format": "torchscript",
        "input": {"height": cfg.height, "width": cfg.width},
        "preprocess": {
            "resize": "linear",
            "mean": list(MEAN_LITE),
            "std": list(STD_LITE),
            "mean_train": list(MEAN_TRAIN),
            "std_train": list(STD_TRAIN),
        },
        "arch": {
            "patch": PATCH,
            "embed_dim": cfg.embed_dim,
            "depth": cfg.depth,
            "heads": cfg.heads,
            "mlp": cfg.mlp,
            "head_channels": cfg.head_channels,
            "num_classes": NUM_CLASSES,
        },
        "labels": {"name": "goliath-28", "classes": list(CLASSES),
                   "palette": [list(c) for c in PALETTE]},
    }


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

SYNTH_IMAGES = {  # file name -> (H, W, seed)
    "synth_33x47.png": (33, 47, 11),
    "synth_300x211.png": (300, 211, 12),
    "synth_1080x1920.png": (1080, 1920, 13),
    "synth_landscape_480x640.png": (480, 640, 14),
}


def synthetic_image(h: int, w: int, seed: int) -> np.ndarray:
    """A BGR uint8 image with smooth gradients, a few filled shapes and mild noise, so that the
    labels form regions rather than per-pixel noise."""
    rs = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy /= max(h - 1, 1)
    xx /= max(w - 1, 1)
    img = np.stack([40 + 150 * xx, 60 + 120 * yy, 200 - 120 * xx * yy], axis=-1)
    s = min(h, w)
    for k in range(7):
        color = tuple(float(v) for v in rs.randint(0, 256, size=3))
        cx, cy = int(rs.uniform(0.1, 0.9) * w), int(rs.uniform(0.1, 0.9) * h)
        if k % 2 == 0:
            axes = (max(1, int(rs.uniform(0.08, 0.3) * s)), max(1, int(rs.uniform(0.08, 0.3) * s)))
            cv2.ellipse(img, (cx, cy), axes, float(rs.uniform(0, 180)), 0, 360, color, -1)
        else:
            dx, dy = int(rs.uniform(0.05, 0.25) * w), int(rs.uniform(0.05, 0.25) * h)
            cv2.rectangle(img, (cx - dx, cy - dy), (cx + dx, cy + dy), color, -1)
    img += rs.normal(0.0, 4.0, size=img.shape).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_synthetic_images(img_dir: Path) -> list[Path]:
    img_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, (h, w, seed) in SYNTH_IMAGES.items():
        p = img_dir / fname
        check(cv2.imwrite(str(p), synthetic_image(h, w, seed)), f"cannot write {p}")
        paths.append(p)
    return paths


def default_example_images() -> list[Path]:
    """The repo's examples/*.png|jpg beside tools/, if that folder exists."""
    ex = Path(__file__).resolve().parent.parent / "examples"
    if not ex.is_dir():
        return []
    return sorted(p for p in ex.iterdir()
                  if p.is_file() and p.suffix.lower() in (".png", ".jpg", ".jpeg"))


# ---------------------------------------------------------------------------------------------
# Reference outputs: the Sapiens-Lite demo pipeline (spec §5.1), fp32 on CPU
# ---------------------------------------------------------------------------------------------


def lite_preprocess(img_bgr: np.ndarray, height: int,
                    width: int) -> tuple[np.ndarray, torch.Tensor]:
    """cv2 linear resize to the model size (aspect not kept), BGR->RGB, (x - mean) / std."""
    resized = cv2.resize(img_bgr, (width, height), interpolation=cv2.INTER_LINEAR)
    t = torch.from_numpy(resized).permute(2, 0, 1)[[2, 1, 0]].float()
    mean = torch.tensor(MEAN_LITE, dtype=torch.float32)
    std = torch.tensor(STD_LITE, dtype=torch.float32)
    return resized, (t - mean[:, None, None]) / std[:, None, None]


def label_fragmentation(labels: np.ndarray) -> float:
    """Fraction of horizontally or vertically adjacent pixel pairs with different labels:
    near 0 for large regions, near 1 for salt-and-pepper noise."""
    diffs = [labels[1:] != labels[:-1], labels[:, 1:] != labels[:, :-1]]
    n = sum(d.size for d in diffs)
    return float(sum(d.sum() for d in diffs) / n) if n else 0.0


def save_arrays(folder: Path, **arrays: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", np.ascontiguousarray(a))


def write_references(cfg: FixtureConfig, model_path: Path, images: list[Path],
                     ref_dir: Path) -> list[dict]:
    """Run the saved file on each image the way the lite demo does and store everything a C++
    comparison needs. Returns per-image statistics."""
    ref_dir.mkdir(parents=True, exist_ok=True)
    for stale in ref_dir.iterdir():  # from images no longer in the set
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    model = torch.jit.load(str(model_path), map_location="cpu")
    stats, inputs, logits_all = [], [], []
    for path in images:
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
        check(img is not None, f"cannot read image {path}")
        h0, w0 = img.shape[:2]
        resized, t = lite_preprocess(img, cfg.height, cfg.width)
        with torch.no_grad():
            logits = model(t[None])
            up = F.interpolate(logits, size=(h0, w0), mode="bilinear")
            top2 = up.topk(2, dim=1).values[0]
            labels = up.argmax(1)[0]
        gap = (top2[0] - top2[1]).numpy().astype(np.float32)
        lab = labels.numpy().astype(np.uint8)
        # Plain .npy files: the C++ tests read them without a zip/deflate reader.
        save_arrays(ref_dir / path.stem, resized=resized, input=t.numpy().astype(np.float32),
                    logits=logits[0].numpy().astype(np.float32), labels=lab, top2_gap=gap)
        inputs.append(t)
        logits_all.append(logits[0])
        stats.append({
            "image": path.name, "size": (h0, w0),
            "logit_min": float(logits.min()), "logit_max": float(logits.max()),
            "labels": int(np.unique(lab).size),
            "gap_min": float(gap.min()), "gap_median": float(np.median(gap)),
            "gap_lt_1e-3": float((gap < 1e-3).mean()),
            "frag": label_fragmentation(lab),
        })

    # Batch reference: the first two images as one batch must match the single runs.
    if len(inputs) >= 2:
        with torch.no_grad():
            batch = model(torch.stack(inputs[:2]))
        d = max(max_abs_diff(batch[i], logits_all[i]) for i in range(2))
        scale = max(float(batch.abs().max()), 1.0)
        check(d <= 1e-4 * scale, f"{cfg.name}: batch logits differ from single (max diff {d})")
        save_arrays(ref_dir / "batch", logits=batch.numpy().astype(np.float32))
        (ref_dir / "batch" / "stems.txt").write_text("".join(f"{p.stem}\n" for p in images[:2]))
    return stats


def check_label_variety(cfg: FixtureConfig, stats: list[dict]) -> None:
    """Random weights must still give labels that depend on the image and form several
    regions; otherwise a C++ port could pass with a constant output."""
    for s in stats:
        h0, w0 = s["size"]
        if h0 * w0 >= 64 * 64:
            check(s["labels"] >= 3, f"{cfg.name}/{s['image']}: only {s['labels']} distinct labels")
            check(s["gap_lt_1e-3"] < 0.05,
                  f"{cfg.name}/{s['image']}: {s['gap_lt_1e-3']:.1%} of pixels are near-ties")
            check(s["frag"] < 0.35,
                  f"{cfg.name}/{s['image']}: labels are fragmented ({s['frag']:.2f})")


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def collect_images(out_dir: Path, extra: list[Path] | None) -> list[Path]:
    images = write_synthetic_images(out_dir / "images")
    seen_paths = {p.resolve() for p in images}
    stems = {p.stem for p in images}
    for p in default_example_images() + [Path(x) for x in (extra or [])]:
        check(p.is_file(), f"image not found: {p}")
        if p.resolve() in seen_paths:
            continue
        check(p.stem not in stems, f"two images share the stem {p.stem!r}: rename one")
        seen_paths.add(p.resolve())
        stems.add(p.stem)
        # A copy beside the synthetic images, so every reference has its source in one folder.
        copy_path = out_dir / "images" / p.name
        shutil.copyfile(p, copy_path)
        seen_paths.add(copy_path.resolve())
        images.append(copy_path)
    return images


# The 0.3b-wide fixture runs at real widths, about 20 s per forward pass on 2 CPU cores: its
# references cover an odd-sized synthetic image and the real photo, not the whole set.
WIDE_REFERENCE_STEMS = ("synth_33x47", "astronaut")


def reference_images(name: str, images: list[Path]) -> list[Path]:
    if name not in ("wide_0.3b", "full_0.3b"):
        return images
    return [p for p in images if p.stem in WIDE_REFERENCE_STEMS]


def build_all(out_dir: Path, wide: bool = False, images: list[Path] | None = None,
              refs: bool = True, names: list[str] | None = None, log=print) -> dict:
    """Build every artefact under out_dir. Raises FixtureError on a failed self-check.

    names restricts the fixtures (default tiny_a, tiny_b, plus wide_0.3b with wide=True); the
    broken variants and the wrong-hash card are written whenever tiny_a is built. refs=False
    skips the images and reference outputs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if names is None:
        names = list(DEFAULT_FIXTURES) + (["wide_0.3b"] if wide else [])
    unknown = [n for n in names if n not in FIXTURES]
    check(not unknown, f"unknown fixtures {unknown}; known: {sorted(FIXTURES)}")
    result: dict = {"fixtures": {}, "broken": [], "refs": {}, "files": []}

    img_paths = collect_images(out_dir, images) if refs else []
    cards_dir = out_dir / "cards"
    for name in names:
        t0 = time.time()
        cfg, model, path, info = build_fixture(name, out_dir)
        log(f"[{name}] traced+verified in {time.time() - t0:.1f}s: {info['entries']} entries, "
            f"|logit|max {info['max_abs_logit']:.2f}, eager diff {info['diff_eager']:.1e}, "
            f"batch diff {info['diff_batch']:.1e}")
        card = make_card(cfg, path)
        write_json(cards_dir / f"{name}.json", card)
        result["fixtures"][name] = {"path": path, "info": info}
        result["files"] += [path, cards_dir / f"{name}.json"]
        if name == "tiny_a":
            wrong = dict(card, id="fixture-wrong-hash", sha256="0" * 64,
                         description="Tiny-A card with a wrong sha256 (test only)")
            write_json(cards_dir / "broken-wrong-hash.json", wrong)
            result["files"].append(cards_dir / "broken-wrong-hash.json")
            result["broken"] = write_broken_variants(model, cfg, path, out_dir)
            for p, line in result["broken"]:
                log(f"[broken] {p.name}: {line}")
                result["files"].append(p)
            p_defl = out_dir / DEFLATED_FILE
            write_deflated(path, p_defl)
            x = example_input(cfg)
            with torch.no_grad():
                same = torch.equal(torch.jit.load(str(p_defl), map_location="cpu")(x),
                                   torch.jit.load(str(path), map_location="cpu")(x))
            check(same, f"{p_defl.name}: torch.jit.load gives other outputs than the original")
            log(f"[deflated] {p_defl.name}: every record deflated; torch.jit.load reads it, "
                f"same outputs")
            result["files"].append(p_defl)
        del model
        if refs:
            t0 = time.time()
            stats = write_references(cfg, path, reference_images(name, img_paths),
                                     out_dir / "ref" / name)
            for s in stats:
                log(f"[{name}] ref {s['image']} {s['size'][0]}x{s['size'][1]}: logits "
                    f"[{s['logit_min']:.2f}, {s['logit_max']:.2f}], {s['labels']} labels, "
                    f"top2 gap min {s['gap_min']:.2e} median {s['gap_median']:.3f}, "
                    f"<1e-3 {s['gap_lt_1e-3']:.2%}, fragmentation {s['frag']:.3f}")
            log(f"[{name}] references in {time.time() - t0:.1f}s")
            check_label_variety(cfg, stats)
            result["refs"][name] = stats
    return result


# ---- reuse: a run is not repeated while what it wrote stands as it left it ------------------
# ctest runs fixtures.generate before every invocation that needs fixtures, and the wide ones
# (minutes each) before every slow run: a run with the same arguments, the same generator code
# and the same library versions writes the same bytes again, so it is skipped while every file
# it wrote is still there unchanged. The record is <out>/.runs/<arguments' hash>.json.
RUNS_DIR = ".runs"
HASHED_MAX = 64 << 20  # larger files (the wide checkpoints) are checked by size and mtime


def run_key(args: argparse.Namespace) -> tuple[str, str]:
    """(record name, key): the arguments name the record; the key adds what the bytes depend on."""
    named = json.dumps({"only": sorted(args.only) if args.only else None, "wide": args.wide,
                        "images": sorted(str(Path(p).resolve()) for p in args.images)})
    h = hashlib.sha256(named.encode())
    for p in sorted(Path(__file__).resolve().parent.glob("*.py")):  # generators, reference nets
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    for p in default_example_images() + [Path(x) for x in args.images]:
        h.update(p.read_bytes() if p.is_file() else b"missing")
    h.update(f"{torch.__version__} {np.__version__} {cv2.__version__}".encode())
    return hashlib.sha256(named.encode()).hexdigest()[:16], h.hexdigest()


def file_state(p: Path) -> list:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns if st.st_size > HASHED_MAX else sha256_file(p)]


def run_is_current(out_dir: Path, name: str, key: str) -> bool:
    try:
        rec = json.loads((out_dir / RUNS_DIR / f"{name}.json").read_text())
        return rec["key"] == key and all(
            file_state(out_dir / rel) == state for rel, state in rec["files"].items())
    except (OSError, ValueError, KeyError):
        return False


def record_run(out_dir: Path, name: str, key: str, since_ns: int) -> None:
    """Records the files under out_dir written since since_ns (this run's)."""
    files = {str(p.relative_to(out_dir)): file_state(p) for p in sorted(out_dir.rglob("*"))
             if p.is_file() and RUNS_DIR not in p.relative_to(out_dir).parts
             and p.stat().st_mtime_ns >= since_ns}
    write_json(out_dir / RUNS_DIR / f"{name}.json", {"key": key, "files": files})


def main(argv: list[str] | None = None) -> int:
    # Sapiens2 fixtures (tools/sapiens2_fixtures.py; imported here, since it imports this module).
    import sapiens2_fixtures as s2f

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--wide", action="store_true",
                    help="also build the 0.3B-width fixture (slow, ~250 MB)")
    ap.add_argument("--only", nargs="+", choices=sorted(FIXTURES) + list(s2f.S2_NAMES),
                    default=None,
                    help="build only these fixtures (e.g. --only wide_0.3b s2_tiny)")
    ap.add_argument("--images", nargs="*", type=Path, default=[],
                    help="extra images for the references (examples/ is included by default)")
    ap.add_argument("--force", action="store_true",
                    help="build even when an earlier run with these arguments still stands")
    args = ap.parse_args(argv)
    record, key = run_key(args)
    if not args.force and run_is_current(args.out, record, key):
        print(f"make_fixtures: up to date in {args.out} (an earlier run with these arguments, "
              f"the same generators and libraries; --force builds anew)")
        return 0
    since_ns = time.time_ns() - 1_000_000_000  # coarse file-system clocks
    # torch.jit.* prints a deprecation FutureWarning on every call; the real checkpoints are
    # TorchScript archives, so that is the format we must produce regardless.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")

    t0 = time.time()
    try:
        v1 = None if args.only is None else [n for n in args.only if n in FIXTURES]
        s2 = None if args.only is None else [n for n in args.only if n in s2f.S2_NAMES]
        res = (build_all(args.out, wide=args.wide, images=args.images, names=v1)
               if v1 is None or v1 else {"files": [], "refs": {}})
        if s2 is None or s2:  # the default run builds s2f.S2_DEFAULT (s2_tiny)
            res["files"] += s2f.build_sapiens2(args.out, s2, args.images)["files"]
    except FixtureError as e:
        print(f"make_fixtures: self-check FAILED: {e}", file=sys.stderr)
        return 1
    print("\nfiles:")
    for p in res["files"]:
        print(f"  {p.stat().st_size:>12,d}  {sha256_file(p)[:12]}  {p}")
    n_refs = sum(len(v) for v in res["refs"].values())
    print(f"{n_refs} reference images in {args.out / 'ref'}; total {time.time() - t0:.1f}s")
    record_run(args.out, record, key, since_ns)
    return 0


if __name__ == "__main__":
    # Run through the importable module rather than __main__, so the TorchScript type names in
    # the archives (__torch__.make_fixtures.*) and hence the file bytes are the same whether the
    # fixtures are built from the command line or from the tests.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_fixtures

    sys.exit(make_fixtures.main())
