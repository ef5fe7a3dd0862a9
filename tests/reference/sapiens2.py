#!/usr/bin/env python3
"""The project's own PyTorch reference of the Sapiens2 body-part segmentation model.

Written from the project's network spec, shared/spec/sapiens2.md (sections 2, 3, 4, 5, 8 and 9),
not from the authors' or Hugging Face's code: only facts carry over. The module tree reproduces
the authors' `SegEstimator` (children `backbone` and `decode_head`), so `state_dict()` gives
exactly the key names and shapes of the released `sapiens2_*_seg.safetensors` files (spec §4.2,
§4.3), and the forward pass follows the eager fp32 numerics of the authors' demo (spec §2.3-2.5,
§3, §8), including the bf16 RoPE path:

    normalised RGB [B, 3, H, W] fp32
      -> patch embed (Conv2d k16 s16, bias) -> [cls, 8 storage tokens, patches]   (N = 9 + P)
      -> L x [x += gamma * proj(attn(RMSNorm(x)));  x += w3(SiLU(a) * b), (a, b) = w12(RMSNorm(x))]
         attention: qk-norm per head, GQA (kv = heads // 2) for 8 <= i < L - 8, 2D RoPE in bf16
      -> final RMSNorm -> drop the 9 prefix tokens -> [B, C, Hp, Wp]
      -> 4 x [ConvTranspose2d k4 s2 p1 (no bias), InstanceNorm2d, SiLU]
      -> 2 x [Conv2d 1x1, InstanceNorm2d, SiLU] -> Conv2d 1x1 -> logits [B, 29, 16 Hp, 16 Wp]

Also here: the authors' demo preprocessing (spec §5), a strict checkpoint loader (the released
files are loaded non-strictly by the authors; the project's loader refuses any mismatch), and the
key conversion between the authors' names and the newest Hugging Face transformers layout (§9).

The module can be imported without side effects (`from reference.sapiens2 import Sapiens2Seg`,
with tests/ on sys.path); it imports nothing from the fixture makers (tests/fixtures/).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PATCH = 16
NUM_STORAGE_TOKENS = 8  # "register" tokens
NUM_PREFIX_TOKENS = 1 + NUM_STORAGE_TOKENS  # cls + registers
NUM_CLASSES = 29
NORM_EPS = 1e-6  # every RMSNorm (ln1, ln2, final norm, q/k-norm)
ROPE_BASE = 100.0
ROPE_DTYPE = torch.bfloat16  # pos_embed_rope_dtype="bf16", also in the fp32 model (spec §8.2)
# The hard-coded GQA rule (spec §2.1): the first and the last 8 blocks use full MHA.
FULL_ATTENTION_FIRST = 8
FULL_ATTENTION_LAST = 8

# Authors' demo normalisation, RGB order on the 0-255 scale (spec §5).
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sapiens2Config:
    embed_dim: int  # C
    depth: int  # L
    heads: int  # H_h
    mlp: int  # F, the SwiGLU hidden size (4 C in every released size)
    deconv_channels: tuple[int, ...] = (512, 256, 128, 64)
    conv_channels: tuple[int, ...] = (64, 64)
    num_classes: int = NUM_CLASSES

    def __post_init__(self) -> None:
        if self.embed_dim % (4 * self.heads):
            raise ValueError("embed_dim must be a multiple of 4 * heads (RoPE needs hd % 4 == 0)")
        if len(self.deconv_channels) != 4 or len(self.conv_channels) != 2:
            raise ValueError("the seg head has 4 deconv stages and 2 conv stages")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.heads

    def kv_heads(self, layer: int) -> int:
        """KV heads of block `layer`: full MHA in the first and last 8 blocks, else heads // 2."""
        if layer < FULL_ATTENTION_FIRST or layer >= self.depth - FULL_ATTENTION_LAST:
            return self.heads
        return self.heads // 2

    def gqa_layers(self) -> list[int]:
        return [i for i in range(self.depth) if self.kv_heads(i) != self.heads]

    @classmethod
    def real(cls, size: str) -> "Sapiens2Config":
        """The released seg sizes (spec §2.1)."""
        c, depth, heads = {"0.4b": (1024, 24, 16), "0.8b": (1280, 32, 16),
                           "1b": (1536, 40, 24), "5b": (2432, 56, 32)}[size]
        return cls(c, depth, heads, 4 * c)


# ---------------------------------------------------------------------------------------------
# Backbone
# ---------------------------------------------------------------------------------------------


def rope_periods(head_dim: int, base: float = ROPE_BASE, dtype: torch.dtype = ROPE_DTYPE
                 ) -> torch.Tensor:
    """periods[j] = base ** (2 j / (hd / 2)), j < hd / 4, each step rounded to `dtype`."""
    j = torch.arange(head_dim // 4, dtype=dtype)
    return base ** (2 * j / (head_dim // 2))


def rope_tables(periods: torch.Tensor, hp: int, wp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin, cos), each [hp * wp, hd], in periods' dtype, with the eager op order of spec §8.2.

    Positions are normalised per axis to (-1, 1) ("separate"); the angle row of a token is
    [theta_y[0..hd/4), theta_x[0..hd/4)] tiled twice, theta = 2 pi pos / periods."""
    dtype = periods.dtype
    dev = periods.device
    ys = torch.arange(0.5, hp, dtype=dtype, device=dev) / hp
    xs = torch.arange(0.5, wp, dtype=dtype, device=dev) / wp
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1)  # [hp, wp, 2]
    coords = coords.flatten(0, 1)  # [P, 2], row-major (h then w)
    coords = 2.0 * coords - 1.0
    angles = 2 * math.pi * coords[:, :, None] / periods[None, None, :]  # [P, 2, hd/4]
    angles = angles.flatten(1, 2)  # [P, hd/2]: y block, then x block
    angles = angles.tile(2)  # [P, hd]
    return torch.sin(angles), torch.cos(angles)


class RopePositionEmbedding(nn.Module):
    """Holds the persistent bf16 `periods` buffer; forward builds the tables for a grid."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.register_buffer("periods", rope_periods(head_dim), persistent=True)

    def forward(self, hp: int, wp: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(self.periods, hp, wp)


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    h = t.shape[-1] // 2
    return torch.cat((-t[..., h:], t[..., :h]), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the patch tokens of q and k ([B, heads, N, hd]).

    q and k are cast to the tables' dtype (bf16) for ALL tokens, the prefix tokens (cls and
    registers) are left unrotated, and the result is cast back: q and k entering attention
    carry bf16 precision only (spec §8.2)."""
    sin, cos = rope
    out = []
    for t in (q, k):
        t_dtype = t.dtype
        t = t.to(sin.dtype)
        prefix = t.shape[-2] - sin.shape[-2]
        rotated = (t[:, :, prefix:] * cos) + (rotate_half(t[:, :, prefix:]) * sin)
        t = torch.cat((t[:, :, :prefix], rotated), dim=-2)
        out.append(t.to(t_dtype))
    return out[0], out[1]


class PatchEmbed(nn.Module):
    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(3, embed_dim, kernel_size=PATCH, stride=PATCH, bias=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.projection(x)
        grid = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), grid  # [B, Hp*Wp, C], token = row * Wp + col


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_value: float = 1e-4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), init_value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class GroupedQueryAttention(nn.Module):
    """MHA when kv_heads == heads, else GQA with kv head j serving query heads 2j, 2j+1."""

    def __init__(self, embed_dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = embed_dim // heads
        self.wq = nn.Linear(embed_dim, heads * self.head_dim, bias=True)
        self.wk = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=True)
        self.wv = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=True)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=NORM_EPS)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=NORM_EPS)
        self.proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.gamma = LayerScale(embed_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, n, c = x.shape
        hd = self.head_dim
        q = self.wq(x).reshape(b, n, self.heads, hd).permute(0, 2, 1, 3)
        k = self.wk(x).reshape(b, n, self.kv_heads, hd).permute(0, 2, 1, 3)
        v = self.wv(x).reshape(b, n, self.kv_heads, hd).permute(0, 2, 1, 3)
        q = self.q_norm(q)
        k = self.k_norm(k)
        if self.kv_heads != self.heads:
            factor = self.heads // self.kv_heads
            k = k.repeat_interleave(factor, dim=1)
            v = v.repeat_interleave(factor, dim=1)
        q, k = apply_rope(q, k, rope)
        x = F.scaled_dot_product_attention(q, k, v)  # no mask, scale 1/sqrt(hd)
        x = x.transpose(1, 2).reshape(b, n, c)  # head-major channels
        return self.gamma(self.proj(x))


class SwiGLUFFN(nn.Module):
    """identity + w3(SiLU(first half of w12(x)) * second half); no layer scale on this branch."""

    def __init__(self, embed_dim: int, hidden: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(embed_dim, 2 * hidden, bias=True)
        self.w3 = nn.Linear(hidden, embed_dim, bias=True)

    def forward(self, x: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.w12(x).chunk(2, dim=-1)
        return identity + self.w3(F.silu(x1) * x2)


class TransformerBlock(nn.Module):
    def __init__(self, embed_dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.ln1 = nn.RMSNorm(embed_dim, eps=NORM_EPS)
        self.attn = GroupedQueryAttention(embed_dim, heads, kv_heads)
        self.ln2 = nn.RMSNorm(embed_dim, eps=NORM_EPS)
        self.ffn = SwiGLUFFN(embed_dim, hidden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), rope)
        return self.ffn(self.ln2(x), identity=x)


class Sapiens2Backbone(nn.Module):
    def __init__(self, cfg: Sapiens2Config) -> None:
        super().__init__()
        c = cfg.embed_dim
        self.embed_dim = c
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.storage_tokens = nn.Parameter(torch.zeros(1, NUM_STORAGE_TOKENS, c))
        self.patch_embed = PatchEmbed(c)
        self.rope_embed = RopePositionEmbedding(cfg.head_dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(c, cfg.heads, cfg.kv_heads(i), cfg.mlp) for i in range(cfg.depth))
        self.ln1 = nn.RMSNorm(c, eps=NORM_EPS)  # final norm

    def forward(self, x: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
        b = x.shape[0]
        x, (hp, wp) = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(b, -1, -1),
                       self.storage_tokens.expand(b, -1, -1), x), dim=1)
        rope = self.rope_embed(hp, wp)  # rebuilt per call: any grid works
        if trace is not None:
            trace["tokens"] = x.detach().clone()
            trace["rope_sin"], trace["rope_cos"] = (t.detach().clone() for t in rope)
        for i, block in enumerate(self.blocks):
            x = block(x, rope)
            if trace is not None:
                trace[f"block_{i:02d}"] = x.detach().clone()
        x = self.ln1(x)
        if trace is not None:
            trace["final_norm"] = x.detach().clone()
        # Drop the prefix tokens; the result is a non-contiguous view, as in the original.
        return x[:, NUM_PREFIX_TOKENS:].reshape(b, hp, wp, self.embed_dim).permute(0, 3, 1, 2)


# ---------------------------------------------------------------------------------------------
# Seg head
# ---------------------------------------------------------------------------------------------


class SegHead(nn.Module):
    def __init__(self, in_channels: int, deconv_channels: tuple[int, ...],
                 conv_channels: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = in_channels
        for c_out in deconv_channels:
            layers += [nn.ConvTranspose2d(c_in, c_out, kernel_size=4, stride=2, padding=1,
                                          output_padding=0, bias=False),
                       nn.InstanceNorm2d(c_out), nn.SiLU(inplace=True)]
            c_in = c_out
        self.deconv_layers = nn.Sequential(*layers)
        layers = []
        for c_out in conv_channels:
            layers += [nn.Conv2d(c_in, c_out, kernel_size=1, bias=True),
                       nn.InstanceNorm2d(c_out), nn.SiLU(inplace=True)]
            c_in = c_out
        self.conv_layers = nn.Sequential(*layers)
        self.conv_seg = nn.Conv2d(c_in, num_classes, kernel_size=1, bias=True)

    def forward(self, x: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
        stage = 0
        for seq in (self.deconv_layers, self.conv_layers):
            for j in range(0, len(seq), 3):
                x = seq[j + 2](seq[j + 1](seq[j](x)))
                if trace is not None:
                    trace[f"head_{stage}"] = x.detach().clone()
                stage += 1
        return self.conv_seg(x)


class Sapiens2Seg(nn.Module):
    """Stand-in for the authors' SegEstimator: normalised RGB [B,3,H,W] -> logits
    [B, classes, 16*floor(H/16), 16*floor(W/16)] (no softmax)."""

    def __init__(self, cfg: Sapiens2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = Sapiens2Backbone(cfg)
        self.decode_head = SegHead(cfg.embed_dim, cfg.deconv_channels, cfg.conv_channels,
                                   cfg.num_classes)

    def forward(self, x: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
        feat = self.backbone(x, trace)
        if trace is not None:
            trace["featmap"] = feat.detach().clone()
        logits = self.decode_head(feat, trace)
        if trace is not None:
            trace["logits"] = logits.detach().clone()
        return logits


# ---------------------------------------------------------------------------------------------
# Expected checkpoint contents (spec §4.2, §4.3), independent of the module code above
# ---------------------------------------------------------------------------------------------


def expected_shapes(cfg: Sapiens2Config) -> dict[str, tuple[int, ...]]:
    """Every key of an original seg checkpoint with its shape: 17 L + 6 + 10 tensors."""
    c, hd, f = cfg.embed_dim, cfg.head_dim, cfg.mlp
    out: dict[str, tuple[int, ...]] = {
        "backbone.cls_token": (1, 1, c),
        "backbone.storage_tokens": (1, NUM_STORAGE_TOKENS, c),
        "backbone.patch_embed.projection.weight": (c, 3, PATCH, PATCH),
        "backbone.patch_embed.projection.bias": (c,),
        "backbone.rope_embed.periods": (hd // 4,),
        "backbone.ln1.weight": (c,),
    }
    for i in range(cfg.depth):
        p = f"backbone.blocks.{i}."
        kv = cfg.kv_heads(i) * hd
        out.update({
            p + "ln1.weight": (c,),
            p + "attn.wq.weight": (c, c), p + "attn.wq.bias": (c,),
            p + "attn.wk.weight": (kv, c), p + "attn.wk.bias": (kv,),
            p + "attn.wv.weight": (kv, c), p + "attn.wv.bias": (kv,),
            p + "attn.q_norm.weight": (hd,), p + "attn.k_norm.weight": (hd,),
            p + "attn.proj.weight": (c, c), p + "attn.proj.bias": (c,),
            p + "attn.gamma.weight": (c,),
            p + "ln2.weight": (c,),
            p + "ffn.w12.weight": (2 * f, c), p + "ffn.w12.bias": (2 * f,),
            p + "ffn.w3.weight": (c, f), p + "ffn.w3.bias": (c,),
        })
    c_in = c
    for j, c_out in zip((0, 3, 6, 9), cfg.deconv_channels):
        out[f"decode_head.deconv_layers.{j}.weight"] = (c_in, c_out, 4, 4)
        c_in = c_out
    for j, c_out in zip((0, 3), cfg.conv_channels):
        out[f"decode_head.conv_layers.{j}.weight"] = (c_out, c_in, 1, 1)
        out[f"decode_head.conv_layers.{j}.bias"] = (c_out,)
        c_in = c_out
    out["decode_head.conv_seg.weight"] = (cfg.num_classes, c_in, 1, 1)
    out["decode_head.conv_seg.bias"] = (cfg.num_classes,)
    return out


PERIODS_KEY = "backbone.rope_embed.periods"


class CheckpointError(ValueError):
    """A checkpoint does not match the model exactly."""


def check_state_dict(sd: dict[str, torch.Tensor], cfg: Sapiens2Config) -> None:
    """Strict: the exact key set, the exact shapes, F32 everywhere except periods (F32 or BF16)."""
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    if missing or extra:
        raise CheckpointError(f"key set differs: missing {missing}, unexpected {extra}")
    for k, shape in want.items():
        if tuple(sd[k].shape) != shape:
            raise CheckpointError(f"{k}: shape {tuple(sd[k].shape)}, expected {shape}")
        ok = (torch.float32, torch.bfloat16) if k == PERIODS_KEY else (torch.float32,)
        if sd[k].dtype not in ok:
            raise CheckpointError(f"{k}: dtype {sd[k].dtype}, expected one of {ok}")


def load_strict(path: str | Path, cfg: Sapiens2Config) -> Sapiens2Seg:
    """Load an original-key or HF-key safetensors file into a fresh model, refusing any
    mismatch. A truncated or damaged file raises from safetensors itself."""
    from safetensors.torch import load_file

    sd = load_file(str(path), device="cpu")
    if is_hf_state_dict(sd):
        sd = hf_to_original(sd, head_dim=cfg.head_dim)
    check_state_dict(sd, cfg)
    model = Sapiens2Seg(cfg)
    # load_state_dict copies into the module's bf16 buffer, as the authors' load does.
    model.load_state_dict(sd, strict=True)
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Hugging Face transformers key names (newest port, spec §9)
# ---------------------------------------------------------------------------------------------

# One-to-one renames as (original pattern, HF pattern). "{i}" is a block index, "{wb}" weight or
# bias; "{s}" is a head stage: Sequential index 3 s in the original, s in HF.
_HF_RENAMES = [
    ("backbone.cls_token", "model.embeddings.cls_token"),
    ("backbone.storage_tokens", "model.embeddings.register_tokens"),
    ("backbone.patch_embed.projection.{wb}", "model.embeddings.patch_embeddings.{wb}"),
    ("backbone.blocks.{i}.ln1.weight", "model.layer.{i}.norm1.weight"),
    ("backbone.blocks.{i}.attn.wq.{wb}", "model.layer.{i}.attention.q_proj.{wb}"),
    ("backbone.blocks.{i}.attn.wk.{wb}", "model.layer.{i}.attention.k_proj.{wb}"),
    ("backbone.blocks.{i}.attn.wv.{wb}", "model.layer.{i}.attention.v_proj.{wb}"),
    ("backbone.blocks.{i}.attn.proj.{wb}", "model.layer.{i}.attention.o_proj.{wb}"),
    ("backbone.blocks.{i}.attn.q_norm.weight", "model.layer.{i}.attention.q_norm.weight"),
    ("backbone.blocks.{i}.attn.k_norm.weight", "model.layer.{i}.attention.k_norm.weight"),
    ("backbone.blocks.{i}.attn.gamma.weight", "model.layer.{i}.layer_scale1.lambda1"),
    ("backbone.blocks.{i}.ln2.weight", "model.layer.{i}.norm2.weight"),
    ("backbone.blocks.{i}.ffn.w3.{wb}", "model.layer.{i}.mlp.down_proj.{wb}"),
    ("backbone.ln1.weight", "model.norm.weight"),
    ("decode_head.deconv_layers.{s3}.weight", "decode_head.upsample_layers.{s}.convolution.weight"),
    ("decode_head.conv_layers.{s3}.{wb}", "decode_head.conv_layers.{s}.convolution.{wb}"),
    ("decode_head.conv_seg.{wb}", "decode_head.predictor.{wb}"),
]
_FIELDS = {"i": r"(?P<i>\d+)", "wb": r"(?P<wb>weight|bias)", "s": r"(?P<s>\d+)",
           "s3": r"(?P<s3>\d+)"}


def _pattern(template: str) -> re.Pattern:
    rx = re.escape(template)
    for name, group in _FIELDS.items():
        rx = rx.replace(re.escape("{" + name + "}"), group)
    return re.compile(rx)


def _rename(key: str, src: int) -> str | None:
    """The other side's name of `key` (src 0: key is original, 1: key is HF), or None."""
    for pair in _HF_RENAMES:
        m = _pattern(pair[src]).fullmatch(key)
        if not m:
            continue
        g = dict(m.groupdict())
        if "s3" in g:  # original Sequential index -> HF stage
            if int(g["s3"]) % 3:
                return None
            g["s"] = str(int(g["s3"]) // 3)
        elif "s" in g:  # HF stage -> original Sequential index
            g["s3"] = str(int(g["s"]) * 3)
        return pair[1 - src].format(**g)
    return None


_W12 = re.compile(r"backbone\.blocks\.(\d+)\.ffn\.w12\.(weight|bias)")
_HF_GATE_UP = re.compile(r"model\.layer\.(\d+)\.mlp\.(gate_proj|up_proj)\.(weight|bias)")


def original_to_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Authors' key names -> newest transformers names. periods is dropped (the newest port
    builds its RoPE itself and ignores that key); w12 is split into gate_proj (rows [0, 4C),
    the SiLU half) and up_proj (rows [4C, 8C))."""
    out: dict[str, torch.Tensor] = {}
    for k, t in sd.items():
        if k == PERIODS_KEY:
            continue
        m = _W12.fullmatch(k)
        if m:
            i, kind = m.groups()
            half = t.shape[0] // 2
            out[f"model.layer.{i}.mlp.gate_proj.{kind}"] = t[:half].clone()
            out[f"model.layer.{i}.mlp.up_proj.{kind}"] = t[half:].clone()
            continue
        name = _rename(k, 0)
        if name is None:
            raise CheckpointError(f"no HF name for key {k}")
        out[name] = t
    return out


def is_hf_state_dict(sd: dict[str, torch.Tensor]) -> bool:
    return "model.embeddings.cls_token" in sd


def hf_to_original(sd: dict[str, torch.Tensor], head_dim: int | None = None
                   ) -> dict[str, torch.Tensor]:
    """Newest transformers names -> authors' names. With head_dim, the periods buffer that the
    HF file lacks is recomputed in bf16, as the authors' module computes it (spec §2.5)."""
    out: dict[str, torch.Tensor] = {}
    pending: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for k, t in sd.items():
        m = _HF_GATE_UP.fullmatch(k)
        if m:
            i, which, kind = m.groups()
            pending.setdefault((i, kind), {})[which] = t
            continue
        name = _rename(k, 1)
        if name is None:
            raise CheckpointError(f"unknown HF key {k}")
        out[name] = t
    for (i, kind), parts in pending.items():
        if set(parts) != {"gate_proj", "up_proj"}:
            raise CheckpointError(f"layer {i}: {kind} needs both gate_proj and up_proj")
        out[f"backbone.blocks.{i}.ffn.w12.{kind}"] = torch.cat(
            (parts["gate_proj"], parts["up_proj"]), dim=0)
    if head_dim is not None:
        out[PERIODS_KEY] = rope_periods(head_dim)
    return out


# ---------------------------------------------------------------------------------------------
# Pre/post-processing of the authors' demo (spec §5)
# ---------------------------------------------------------------------------------------------


def demo_resize(img_bgr: np.ndarray, height: int, width: int) -> np.ndarray:
    """Stretch to width x height: INTER_AREA when the width shrinks, else INTER_CUBIC (the
    decision looks at the width only, and the same flag serves both axes)."""
    interp = cv2.INTER_AREA if width < img_bgr.shape[1] else cv2.INTER_CUBIC
    return cv2.resize(img_bgr, (width, height), interpolation=interp)


def demo_preprocess(img_bgr: np.ndarray, height: int = 1024, width: int = 768
                    ) -> tuple[np.ndarray, torch.Tensor]:
    """BGR uint8 image -> (resized RGB uint8 [H, W, 3], normalised fp32 [3, H, W])."""
    resized = demo_resize(img_bgr, height, width)
    t = torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).float()
    t = t[[2, 1, 0]]  # BGR -> RGB
    mean = torch.tensor(MEAN, dtype=torch.float32)[:, None, None]
    std = torch.tensor(STD, dtype=torch.float32)[:, None, None]
    rgb = np.ascontiguousarray(resized[:, :, ::-1])
    return rgb, ((t - mean) / std).contiguous()


def demo_postprocess(logits: torch.Tensor, h0: int, w0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K, h, w] -> (labels int64 [B, h0, w0], top-2 gap fp32 [B, h0, w0]):
    bilinear resize (align_corners False, no antialias), then argmax over classes."""
    up = F.interpolate(logits, size=(h0, w0), mode="bilinear", align_corners=False)
    labels = up.argmax(1)
    top2 = up.topk(2, dim=1).values
    return labels, top2[:, 0] - top2[:, 1]
