#!/usr/bin/env python3
"""The project's own PyTorch definition of the Sapiens v1 segmentation network, and the
Sapiens-Lite demo's pre-processing: the tests' oracle for Sapiens v1.

All architecture facts (module tree, key names, norms, attention, head, pre/post-processing)
come from the project's network spec, shared/spec/sapiens_v1.md (sections 1, 2, 3, 5.1 and 10);
the code below is written from that spec alone. The module tree mirrors the authors'
EncoderDecoder, so `state_dict()` gives the released files' key names and shapes, and a CPU
trace of it at batch 1 has the structure of their TorchScript files.

Imports nothing from the fixture makers (tests/fixtures/), which import this module; the
benchmarks' ONNX export (tools/export_onnx.py) builds on it too. Importing it has no side effects
(`from reference.sapiens_v1 import SapiensV1Seg`, with tests/ on sys.path).
"""

from __future__ import annotations

import json
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
_CARD = Path(__file__).resolve().parents[2] / "cards" / "sapiens-seg-0.3b-goliath.json"
with open(_CARD, encoding="utf-8") as _f:
    _LABELS = json.load(_f)["labels"]
CLASSES = list(_LABELS["classes"])
PALETTE = [list(c) for c in _LABELS["palette"]]
assert len(CLASSES) == NUM_CLASSES and len(PALETTE) == NUM_CLASSES


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

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.decode_head(self.backbone(inputs))


# ---------------------------------------------------------------------------------------------
# The Sapiens-Lite demo pipeline around the network (spec §5.1), fp32 on the CPU
# ---------------------------------------------------------------------------------------------


def lite_normalise(resized_bgr: np.ndarray) -> torch.Tensor:
    """BGR uint8 [H, W, 3] at the model size -> RGB, (x - mean) / std: fp32 [3, H, W]."""
    t = torch.from_numpy(resized_bgr).permute(2, 0, 1)[[2, 1, 0]].float()
    mean = torch.tensor(MEAN_LITE, dtype=torch.float32)
    std = torch.tensor(STD_LITE, dtype=torch.float32)
    return (t - mean[:, None, None]) / std[:, None, None]


def lite_preprocess(img_bgr: np.ndarray, height: int,
                    width: int) -> tuple[np.ndarray, torch.Tensor]:
    """cv2 linear resize to the model size (aspect not kept), then lite_normalise."""
    resized = cv2.resize(img_bgr, (width, height), interpolation=cv2.INTER_LINEAR)
    return resized, lite_normalise(resized)


def demo_postprocess(logits: torch.Tensor, h0: int, w0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [1, K, h, w] -> (labels int64 [h0, w0], top-2 gap fp32 [h0, w0]): one bilinear
    resize to the input size (align_corners False), then argmax over classes."""
    up = F.interpolate(logits, size=(h0, w0), mode="bilinear")
    top2 = up.topk(2, dim=1).values[0]
    return up.argmax(1)[0], top2[0] - top2[1]
