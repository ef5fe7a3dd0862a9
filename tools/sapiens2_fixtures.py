#!/usr/bin/env python3
"""Build random-weight Sapiens2 segmentation fixtures for the sapiens-seg tests.

The released Sapiens2 seg checkpoints (0.4B-5B parameters, 1.6-20 GB safetensors) are far too
large for ordinary test runs, so the tests use small models with *exactly* the structure of the
real files: the same key names, dtypes and tensor layouts (spec shared/spec/sapiens2.md §4), the
same forward numerics (bf16 RoPE in an fp32 model, §8), and only widths and depth shrunk (§10).
The model is the project's own reference, tools/sapiens2_reference.py; reference outputs come
from it in fp32 on the CPU with the authors' demo pre/post-processing (§5).

Output layout under --out DIR:

    s2_tiny.safetensors              all F32 except backbone.rope_embed.periods (BF16);
                                     metadata {"format": "pt"}
    s2_tiny_f32periods.safetensors   the same weights with periods stored as F32
    s2_tiny_hf.safetensors           the same weights under the newest transformers key names
                                     (w12 split into gate_proj/up_proj, no periods)
    s2_broken_{missing,shape,unexpected,dtype,truncated}.safetensors
                                     damaged variants of s2_tiny, one per strict-loader failure
    cards/s2_tiny.json               model card (template: cards/sapiens2-seg-0.4b.json)
    ref/s2_tiny/batch_128x96/        a batch of 2 at 128x96 with every intermediate:
                                     input, tokens, rope_cos, rope_sin, block_{00,07,08,09,17},
                                     final_norm, featmap, head_0..head_5, logits (.npy), stems.txt
    ref/s2_tiny/<stem>/              per image at 1024x768: resized (uint8 RGB), input, logits,
                                     labels (uint8 [H0,W0]), top2_gap (fp32 [H0,W0]); for
                                     synth_300x211 also rope_cos, rope_sin, tokens, block_08,
                                     final_norm
    (--only s2_wide_0.4b) s2_wide_0.4b.safetensors, cards/s2_wide_0.4b.json,
                                     ref/s2_wide_0.4b/astronaut/
    (--only s2_full_0.4b|0.8b|1b|5b) s2_full_<size>.safetensors: the released size's exact
                                     layout with random weights, streamed (benchmarks only;
                                     5b is 20.4 GB and needs that much free disk)

The reference images are the ones tools/make_fixtures.py writes to <out>/images/ (created here
with its functions when absent).

Usage:
    python tools/sapiens2_fixtures.py --out build/fixtures [--only s2_tiny s2_wide_0.4b]
                                      [--s2-wide-depth N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_fixtures as mf  # noqa: E402
import sapiens2_reference as s2  # noqa: E402

FixtureError = mf.FixtureError
check = mf.check

REPO = Path(__file__).resolve().parents[1]
CARD_TEMPLATE = REPO / "cards" / "sapiens2-seg-0.4b.json"
METADATA = {"format": "pt"}
STANDARD_HW = (1024, 768)
BATCH_HW = (128, 96)
BATCH_STEMS = ("synth_300x211", "synth_landscape_480x640")
# synth_300x211: the width grows (INTER_CUBIC); synth_1080x1920: it shrinks (INTER_AREA).
TINY_STEMS = ("synth_300x211", "synth_1080x1920", "astronaut")
TINY_TRACE_STEM = "synth_300x211"
WIDE_STEMS = ("astronaut",)
BATCH_TRACE_KEYS = ("tokens", "block_00", "block_07", "block_08", "block_09", "block_17",
                    "final_norm", "featmap", "head_0", "head_1", "head_2", "head_3", "head_4",
                    "head_5")
STEM_TRACE_KEYS = ("tokens", "block_08", "final_norm")
# Relative size of the i.i.d. part of each deconv kernel. make_fixtures.py uses 0.05 for v1;
# Sapiens2's extra 2x stage compounds the phase pattern, and 0.02 halves the label
# fragmentation (0.17 -> 0.09 on synth_300x211) while keeping every kernel > 4 % asymmetric.
DECONV_NOISE = 0.02
IMAGE_FILES = {  # stem -> file name in <out>/images
    "synth_300x211": "synth_300x211.png",
    "synth_1080x1920": "synth_1080x1920.png",
    "synth_landscape_480x640": "synth_landscape_480x640.png",
    "astronaut": "astronaut.jpg",
}


@dataclasses.dataclass(frozen=True)
class S2Fixture:
    name: str
    card_id: str
    description: str
    cfg: s2.Sapiens2Config
    seed: int


def tiny_fixture() -> S2Fixture:
    # Spec §10: C 80, 4 heads (hd 20, hd/4 = 5 odd like 5b), 18 blocks (GQA blocks 8, 9).
    return S2Fixture("s2_tiny", "s2-tiny", "random-weight Sapiens2 tiny fixture (test only)",
                     s2.Sapiens2Config(80, 18, 4, 320, (32, 16, 16, 8), (8, 8)), seed=2001)


def wide_fixture(depth: int = 18) -> S2Fixture:
    # 0.4b widths (C 1024, 16 heads, hd 64, real head channels) with fewer blocks.
    return S2Fixture("s2_wide_0.4b", "s2-wide-0.4b",
                     f"random-weight Sapiens2 0.4B-width fixture, {depth} blocks (test only)",
                     s2.Sapiens2Config(1024, depth, 16, 4096), seed=2002)


# Full-size random-weight files of the released seg sizes, for benchmarks only (never the tests):
# weights only (no references: a 1024x768 reference pass of 5B takes an hour on 2 cores), written
# tensor by tensor so that even the 20 GB 5B file needs one tensor of memory (write_streamed).
FULL_SIZES = {"s2_full_0.4b": "0.4b", "s2_full_0.8b": "0.8b", "s2_full_1b": "1b",
              "s2_full_5b": "5b"}
S2_NAMES = ("s2_tiny", "s2_wide_0.4b", *FULL_SIZES)
S2_DEFAULT = ("s2_tiny",)


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def randomize_(model: s2.Sapiens2Seg, seed: int) -> None:
    """Fill every parameter from a seeded generator (spec §10).

    Backbone linears and the patch embed: N(0, 1/fan_in) (std 0.11 at C 80, 0.031 at C 1024,
    i.e. the usual ~0.02 at real widths while keeping every branch O(1) in the tiny model);
    biases N(0, 0.05); RMSNorm, q/k-norm and LayerScale weights U(0.5, 1.5), so a missing
    multiply or a swapped norm changes the output; cls/storage tokens N(0, 1) like the patch
    tokens. periods is a buffer and stays as the module computed it.

    Head: 1x1 convs Kaiming-like N(0, 1/fan_in), biases N(0, 0.05) (conv_seg 0.1). The deconv
    kernels follow tools/make_fixtures.py: i.i.d. kernels give every output phase of each 2x
    stage an unrelated filter, which InstanceNorm turns into a phase pattern that dominates
    the logits (salt-and-pepper labels). So each kernel is a random channel mix times the
    exact bilinear 2x kernel, plus a small i.i.d. part that keeps it asymmetric."""
    g = torch.Generator().manual_seed(seed)

    def normal(p: torch.Tensor, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)

    def uniform(p: torch.Tensor, lo: float, hi: float) -> None:
        p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float32) * (hi - lo) + lo)

    seen = set()
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            for p_name, p in mod.named_parameters(recurse=False):
                full = f"{mod_name}.{p_name}"
                if full in ("backbone.cls_token", "backbone.storage_tokens"):
                    normal(p, 1.0)
                elif isinstance(mod, (nn.RMSNorm, s2.LayerScale)):
                    uniform(p, 0.5, 1.5)
                elif isinstance(mod, nn.ConvTranspose2d):
                    c_in, c_out = p.shape[:2]
                    mix = torch.randn(c_in, c_out, generator=g) / math.sqrt(c_in)
                    noise = torch.randn(p.shape, generator=g) / math.sqrt(c_in * 4)
                    p.copy_(mix[:, :, None, None] * mf.BILINEAR_2X + DECONV_NOISE * noise)
                elif isinstance(mod, (nn.Linear, nn.Conv2d)) and p_name == "weight":
                    normal(p, 1.0 / math.sqrt(p[0].numel()))
                elif full == "decode_head.conv_seg.bias":
                    normal(p, 0.1)
                elif isinstance(mod, (nn.Linear, nn.Conv2d)) and p_name == "bias":
                    normal(p, 0.05)
                else:
                    raise FixtureError(f"no initialisation rule for parameter {full}")
                seen.add(full)
    missing = {n for n, _ in model.named_parameters()} - seen
    check(not missing, f"parameters left at default init: {sorted(missing)}")


def build_model(fx: S2Fixture) -> s2.Sapiens2Seg:
    """The fixture model, randomised with the fixture's seed, in eval mode. Built on the meta
    device first so the 0.4b-width model skips torch's default init."""
    with torch.device("meta"):
        model = s2.Sapiens2Seg(fx.cfg)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        model.backbone.rope_embed.periods.copy_(s2.rope_periods(fx.cfg.head_dim))
    randomize_(model, fx.seed)
    for i in (0, 3, 6, 9):
        w = model.decode_head.deconv_layers[i].weight.detach()
        asym = float((w - w.flip(2, 3)).norm() / w.norm())
        check(asym > 0.02, f"{fx.name}: deconv_layers.{i} kernel is nearly symmetric ({asym})")
    return model.eval()


def state_dict_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def save_st(sd: dict[str, torch.Tensor], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path), metadata=METADATA)


def file_dtypes(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}


def write_weight_files(fx: S2Fixture, model: s2.Sapiens2Seg, out_dir: Path, log) -> list[Path]:
    """s2_tiny.safetensors (periods BF16), the F32-periods copy and the HF-key copy."""
    sd = state_dict_of(model)
    s2.check_state_dict(sd, fx.cfg)
    check(sd[s2.PERIODS_KEY].dtype == torch.bfloat16, "periods buffer is not bf16")
    files = []
    main = out_dir / f"{fx.name}.safetensors"
    save_st(sd, main)
    files.append(main)
    dt = file_dtypes(main)
    check(dt[s2.PERIODS_KEY] == "BF16" and
          all(v == "F32" for k, v in dt.items() if k != s2.PERIODS_KEY),
          f"{main.name}: unexpected dtypes")
    log(f"[{fx.name}] {main.name}: {len(sd)} tensors, "
        f"{sum(t.numel() for t in sd.values()):,d} values, {main.stat().st_size:,d} B")
    if fx.name != "s2_tiny":
        return files

    sd32 = dict(sd)
    sd32[s2.PERIODS_KEY] = sd[s2.PERIODS_KEY].float()
    p32 = out_dir / f"{fx.name}_f32periods.safetensors"
    save_st(sd32, p32)
    files.append(p32)
    check(file_dtypes(p32)[s2.PERIODS_KEY] == "F32", f"{p32.name}: periods not F32")

    hf = s2.original_to_hf(sd)
    check(s2.hf_to_original(hf, fx.cfg.head_dim).keys() == sd.keys(), "HF round trip keys")
    phf = out_dir / f"{fx.name}_hf.safetensors"
    save_st(hf, phf)
    files.append(phf)
    log(f"[{fx.name}] {p32.name}: {p32.stat().st_size:,d} B; {phf.name}: {len(hf)} tensors, "
        f"{phf.stat().st_size:,d} B")
    return files


BROKEN = ("s2_broken_missing", "s2_broken_shape", "s2_broken_unexpected", "s2_broken_dtype",
          "s2_broken_truncated")


def write_broken(fx: S2Fixture, good: Path, out_dir: Path, log) -> list[Path]:
    """Damaged variants of s2_tiny; each is verified to be refused by the strict loader for the
    reason its name gives."""
    cfg = fx.cfg
    c = cfg.embed_dim
    check(8 in cfg.gqa_layers(), "block 8 must be a GQA block")
    sd = load_file(str(good))
    paths = {n: out_dir / f"{n}.safetensors" for n in BROKEN}

    bad = dict(sd)
    del bad["backbone.blocks.3.attn.k_norm.weight"]
    save_st(bad, paths["s2_broken_missing"])

    bad = dict(sd)
    g = torch.Generator().manual_seed(77)
    key_shape = "backbone.blocks.8.attn.wk.weight"
    bad[key_shape] = torch.randn(c, c, generator=g) / math.sqrt(c)  # MHA shape in a GQA block
    save_st(bad, paths["s2_broken_shape"])

    bad = dict(sd)
    bad["backbone.extra.weight"] = torch.rand(c, generator=g) + 0.5
    save_st(bad, paths["s2_broken_unexpected"])

    bad = dict(sd)
    bad["backbone.ln1.weight"] = sd["backbone.ln1.weight"].round().to(torch.int64)
    save_st(bad, paths["s2_broken_dtype"])

    raw = good.read_bytes()
    paths["s2_broken_truncated"].write_bytes(raw[: int(len(raw) * 0.6)])

    want = s2.expected_shapes(cfg)
    reasons = {}
    for name, p in paths.items():
        try:
            s2.load_strict(p, cfg)
        except Exception as e:  # noqa: BLE001 - refusal, for whatever reason, is the point
            reasons[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:110]}"
        else:
            raise FixtureError(f"{p.name}: the strict loader accepted it")

    def keys(p: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
        with safe_open(str(p), framework="pt") as f:
            return {k: (str(f.get_slice(k).get_dtype()), tuple(f.get_slice(k).get_shape()))
                    for k in f.keys()}

    k = keys(paths["s2_broken_missing"])
    check(set(want) - set(k) == {"backbone.blocks.3.attn.k_norm.weight"} and set(k) < set(want),
          "s2_broken_missing: wrong key difference")
    k = keys(paths["s2_broken_shape"])
    check(set(k) == set(want) and k[key_shape][1] == (c, c) and want[key_shape] == (c // 2, c)
          and all(k[n][1] == want[n] for n in want if n != key_shape),
          "s2_broken_shape: wrong shapes")
    k = keys(paths["s2_broken_unexpected"])
    check(set(k) - set(want) == {"backbone.extra.weight"} and set(want) < set(k)
          and k["backbone.extra.weight"] == ("F32", (c,)), "s2_broken_unexpected: wrong keys")
    k = keys(paths["s2_broken_dtype"])
    check(set(k) == set(want) and k["backbone.ln1.weight"] == ("I64", (c,))
          and all(k[n][0] == "F32" for n in want
                  if n not in ("backbone.ln1.weight", s2.PERIODS_KEY)),
          "s2_broken_dtype: wrong dtypes")
    tr = paths["s2_broken_truncated"].read_bytes()
    check(tr == raw[: len(tr)] and len(tr) == int(len(raw) * 0.6), "s2_broken_truncated")
    for name, p in paths.items():
        log(f"[broken] {p.name} ({p.stat().st_size:,d} B): refused: {reasons[name]}")
    return list(paths.values())


def write_card(fx: S2Fixture, path: Path, cards_dir: Path) -> Path:
    card = json.loads(CARD_TEMPLATE.read_text(encoding="utf-8"))
    had_path_in_repo = "path_in_repo" in card
    cfg = fx.cfg
    gqa = cfg.gqa_layers()
    card.update({
        "id": fx.card_id,
        "description": fx.description,
        "repo": None,
        "revision": None,
        "path_in_repo": None,
        "url": None,
        "file": path.name,
        "size": path.stat().st_size,
        "sha256": mf.sha256_file(path),
        "hash_provenance": "generated by tools/sapiens2_fixtures.py",
    })
    if not had_path_in_repo:
        del card["path_in_repo"]
    card["arch"] = {
        "patch": s2.PATCH,
        "embed_dim": cfg.embed_dim,
        "depth": cfg.depth,
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads(gqa[0]) if gqa else cfg.heads // 2,
        "mlp": cfg.mlp,
        "head_channels": cfg.deconv_channels[0],
        "num_classes": cfg.num_classes,
    }
    check(card["labels"]["name"] == "dome-29" and len(card["labels"]["classes"]) == 29,
          "card template labels are not dome-29")
    check("notice" in card["license"], "card template licence has no notice")
    out = cards_dir / f"{fx.name}.json"
    mf.write_json(out, card)
    return out


# ---------------------------------------------------------------------------------------------
# Full-size files, streamed
# ---------------------------------------------------------------------------------------------


def full_tensor(name: str, shape: tuple[int, ...], cfg: s2.Sapiens2Config, seed: int
                ) -> torch.Tensor:
    """One tensor of a full-size file, by the rules of randomize_ (decided from the key name, as
    the module tree is never built): each from its own seeded generator, so any tensor can be
    made without the others."""
    if name == s2.PERIODS_KEY:
        return s2.rope_periods(cfg.head_dim)  # bf16, as the module computes it
    g = torch.Generator().manual_seed(seed)
    leaf = name.rsplit(".", 2)
    if name in ("backbone.cls_token", "backbone.storage_tokens"):
        return torch.randn(shape, generator=g)
    if (name.endswith(("ln1.weight", "ln2.weight", "q_norm.weight", "k_norm.weight"))
            or name.endswith("attn.gamma.weight")):
        return torch.rand(shape, generator=g) + 0.5  # U(0.5, 1.5)
    if ".deconv_layers." in name:
        c_in, c_out = shape[:2]
        mix = torch.randn(c_in, c_out, generator=g) / math.sqrt(c_in)
        noise = torch.randn(shape, generator=g) / math.sqrt(c_in * 4)
        return mix[:, :, None, None] * mf.BILINEAR_2X + DECONV_NOISE * noise
    if leaf[-1] == "weight":  # linears and 1x1 / patch convolutions: N(0, 1/fan_in)
        return torch.randn(shape, generator=g) / math.sqrt(math.prod(shape[1:]))
    if name == "decode_head.conv_seg.bias":
        return torch.randn(shape, generator=g) * 0.1
    if leaf[-1] == "bias":
        return torch.randn(shape, generator=g) * 0.05
    raise FixtureError(f"no initialisation rule for {name}")


def write_streamed(path: Path, cfg: s2.Sapiens2Config, seed: int, log) -> int:
    """Writes a safetensors file of exactly the released layout (every key of expected_shapes,
    F32, periods BF16, metadata {"format": "pt"}) one tensor at a time; returns its size.

    The format: an 8-byte little-endian header length, the JSON header (entries in the order
    the safetensors package writes them: by dtype, then name; padded with spaces to 8 bytes),
    then the tensors' bytes back to back in header order. The file is checked with the
    safetensors package afterwards (read_back_check)."""
    shapes = s2.expected_shapes(cfg)
    dtypes = {k: ("BF16" if k == s2.PERIODS_KEY else "F32") for k in shapes}
    # safetensors orders by dtype alignment (larger first), then name.
    order = sorted(shapes, key=lambda k: (-(4 if dtypes[k] == "F32" else 2), k))
    header: dict = {"__metadata__": METADATA}
    offset = 0
    for k in order:
        n = math.prod(shapes[k]) * (4 if dtypes[k] == "F32" else 2)
        header[k] = {"dtype": dtypes[k], "shape": list(shapes[k]),
                     "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_name(path.name + ".part")
    t0 = time.time()
    written = 0
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for i, k in enumerate(order):
            t = full_tensor(k, shapes[k], cfg, seed * 100003 + i).contiguous()
            want = torch.bfloat16 if dtypes[k] == "BF16" else torch.float32
            t = t.to(want)
            f.write(t.view(torch.uint8).numpy().tobytes() if want == torch.bfloat16
                    else t.numpy().tobytes())
            written += t.numel() * t.element_size()
            if i % 50 == 0:
                log(f"[full] {path.name}: {i}/{len(order)} tensors, {written / 2**30:.1f} GiB, "
                    f"{time.time() - t0:.0f}s")
    check(written == offset, f"{path.name}: wrote {written} data bytes, header says {offset}")
    tmp.replace(path)
    return path.stat().st_size


def read_back_check(path: Path, cfg: s2.Sapiens2Config) -> None:
    """The safetensors package reads the file: the exact key set, shapes and dtypes of the
    released layout, and a few tensors' values equal to what full_tensor makes."""
    want = s2.expected_shapes(cfg)
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        check(keys == set(want), f"{path.name}: key set differs: "
                                 f"{sorted(keys ^ set(want))[:5]}")
        for k in keys:
            sl = f.get_slice(k)
            check(tuple(sl.get_shape()) == want[k], f"{path.name}: {k} shape")
            check(str(sl.get_dtype()) == ("BF16" if k == s2.PERIODS_KEY else "F32"),
                  f"{path.name}: {k} dtype {sl.get_dtype()}")
        check(f.metadata() == METADATA, f"{path.name}: metadata {f.metadata()}")
        periods = f.get_tensor(s2.PERIODS_KEY)
        check(torch.equal(periods, s2.rope_periods(cfg.head_dim)), f"{path.name}: periods")


def build_full(name: str, out_dir: Path, log) -> list[Path]:
    cfg = s2.Sapiens2Config.real(FULL_SIZES[name])
    path = out_dir / f"{name}.safetensors"
    want = sum(math.prod(v) for v in s2.expected_shapes(cfg).values()) * 4
    free = shutil.disk_usage(out_dir).free
    check(free > want * 1.05, f"{name}: needs {want / 1e9:.1f} GB of disk, {free / 1e9:.1f} free")
    t0 = time.time()
    size = write_streamed(path, cfg, seed=3000 + list(FULL_SIZES).index(name), log=log)
    read_back_check(path, cfg)
    log(f"[{name}] {path.name}: {size:,d} B ({len(s2.expected_shapes(cfg))} tensors; "
        f"C {cfg.embed_dim}, L {cfg.depth}, heads {cfg.heads}) in {time.time() - t0:.0f}s")
    return [path]


# ---------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------


def find_images(out_dir: Path, images: list[Path] | None, stems: set[str]) -> dict[str, Path]:
    """stem -> image path: from `images` when given, else <out>/images, writing the synthetic
    images and copying examples/astronaut.jpg there when absent."""
    found = {p.stem: Path(p) for p in (images or []) if Path(p).stem in stems}
    img_dir = out_dir / "images"
    for stem in sorted(stems - set(found)):
        p = img_dir / IMAGE_FILES[stem]
        if not p.is_file():
            if p.name in mf.SYNTH_IMAGES:
                h, w, seed = mf.SYNTH_IMAGES[p.name]
                img_dir.mkdir(parents=True, exist_ok=True)
                check(cv2.imwrite(str(p), mf.synthetic_image(h, w, seed)), f"cannot write {p}")
            else:
                src = [e for e in mf.default_example_images() if e.name == p.name]
                check(bool(src), f"image {p.name} not found in {img_dir} or examples/")
                img_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src[0], p)
        found[stem] = p
    return found


def read_bgr(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    check(img is not None, f"cannot read image {path}")
    return img


def f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().numpy())


def write_batch_reference(fx: S2Fixture, model: s2.Sapiens2Seg, imgs: dict[str, Path],
                          folder: Path) -> dict:
    h, w = BATCH_HW
    inputs = [s2.demo_preprocess(read_bgr(imgs[s]), h, w)[1] for s in BATCH_STEMS]
    x = torch.stack(inputs)
    trace: dict = {}
    with torch.no_grad():
        logits = model(x, trace)
        singles = [model(t[None]) for t in inputs]
    arrays = {"input": f32(x), "rope_cos": f32(trace["rope_cos"]),
              "rope_sin": f32(trace["rope_sin"])}
    arrays.update({k: f32(trace[k]) for k in BATCH_TRACE_KEYS})
    arrays["logits"] = f32(logits)
    mf.save_arrays(folder, **arrays)
    (folder / "stems.txt").write_text("".join(f"{s}\n" for s in BATCH_STEMS))
    d_single = max(float((logits[i] - singles[i][0]).abs().max()) for i in range(2))
    lab = logits.argmax(1)
    return {"x": x, "logits": logits, "shapes": {k: v.shape for k, v in arrays.items()},
            "d_single": d_single, "label_diff": float((lab[0] != lab[1]).float().mean()),
            "labels": [int(lab[i].unique().numel()) for i in range(2)],
            "frag": [mf.label_fragmentation(lab[i].numpy()) for i in range(2)]}


def write_image_reference(fx: S2Fixture, model: s2.Sapiens2Seg, path: Path, folder: Path,
                          with_trace: bool) -> dict:
    img = read_bgr(path)
    h0, w0 = img.shape[:2]
    resized, t = s2.demo_preprocess(img, *STANDARD_HW)
    trace: dict | None = {} if with_trace else None
    t0 = time.time()
    with torch.no_grad():
        logits = model(t[None], trace)
        dt = time.time() - t0
        labels, gap = s2.demo_postprocess(logits, h0, w0)
    lab = labels[0].numpy().astype(np.uint8)
    gap = f32(gap[0])
    arrays = {"resized": resized, "input": f32(t[None]), "logits": f32(logits),
              "labels": lab, "top2_gap": gap}
    if with_trace:
        arrays.update({"rope_cos": f32(trace["rope_cos"]), "rope_sin": f32(trace["rope_sin"])})
        arrays.update({k: f32(trace[k]) for k in STEM_TRACE_KEYS})
    mf.save_arrays(folder, **arrays)
    return {"image": path.name, "size": (h0, w0), "forward_s": dt,
            "logit_min": float(logits.min()), "logit_max": float(logits.max()),
            "labels": int(np.unique(lab).size), "label_ids": np.unique(lab).tolist(),
            "gap_min": float(gap.min()), "gap_median": float(np.median(gap)),
            "gap_lt_1e-3": float((gap < 1e-3).mean()), "frag": mf.label_fragmentation(lab),
            "argmax_full": logits[0].argmax(0),
            "interp": "INTER_AREA" if STANDARD_HW[1] < w0 else "INTER_CUBIC"}


def check_variety(name: str, stats: list[dict]) -> None:
    """Random weights must still give labels that form regions and depend on the image
    (the criteria of make_fixtures.check_label_variety, plus a cross-image comparison)."""
    for s in stats:
        tag = f"{name}/{s['image']}"
        check(s["labels"] >= 3, f"{tag}: only {s['labels']} distinct labels")
        check(s["gap_lt_1e-3"] < 0.05, f"{tag}: {s['gap_lt_1e-3']:.1%} of pixels are near-ties")
        check(s["frag"] < 0.35, f"{tag}: labels are fragmented ({s['frag']:.2f})")
    for i in range(len(stats)):
        for j in range(i + 1, len(stats)):
            d = float((stats[i]["argmax_full"] != stats[j]["argmax_full"]).float().mean())
            check(d > 0.2, f"{name}: {stats[i]['image']} and {stats[j]['image']} give nearly "
                           f"the same labels at 1024x768 ({d:.1%} differ)")


def log_stats(name: str, s: dict, log) -> None:
    log(f"[{name}] ref {s['image']} {s['size'][0]}x{s['size'][1]} ({s['interp']}): forward "
        f"{s['forward_s']:.1f}s, logits [{s['logit_min']:.2f}, {s['logit_max']:.2f}], "
        f"{s['labels']} labels {s['label_ids']}, top2 gap min {s['gap_min']:.1e} median "
        f"{s['gap_median']:.3f}, <1e-3 {s['gap_lt_1e-3']:.2%}, fragmentation {s['frag']:.3f}")


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def build_one(fx: S2Fixture, out_dir: Path, images: list[Path] | None, log) -> list[Path]:
    t_all = time.time()
    t0 = time.time()
    model = build_model(fx)
    log(f"[{fx.name}] model built and randomised in {time.time() - t0:.1f}s "
        f"(C {fx.cfg.embed_dim}, L {fx.cfg.depth}, heads {fx.cfg.heads}, "
        f"GQA blocks {fx.cfg.gqa_layers()})")
    t0 = time.time()
    files = write_weight_files(fx, model, out_dir, log)
    main = files[0]
    files.append(write_card(fx, main, out_dir / "cards"))
    log(f"[{fx.name}] weights + card written in {time.time() - t0:.1f}s, "
        f"sha256 {mf.sha256_file(main)[:16]}")
    if fx.name == "s2_tiny":
        files += write_broken(fx, main, out_dir, log)

    tiny = fx.name == "s2_tiny"
    stems = TINY_STEMS if tiny else WIDE_STEMS
    imgs = find_images(out_dir, images, set(stems) | (set(BATCH_STEMS) if tiny else set()))
    ref_dir = out_dir / "ref" / fx.name
    if ref_dir.exists():
        shutil.rmtree(ref_dir)
    if tiny:
        t0 = time.time()
        b = write_batch_reference(fx, model, imgs, ref_dir / "batch_128x96")
        log(f"[{fx.name}] ref batch_128x96 {list(BATCH_STEMS)} in {time.time() - t0:.1f}s: "
            f"logits [{float(b['logits'].min()):.2f}, {float(b['logits'].max()):.2f}], labels "
            f"{b['labels']}, fragmentation {b['frag'][0]:.3f}/{b['frag'][1]:.3f}, "
            f"{b['label_diff']:.0%} of labels differ between the two, batch vs single "
            f"{b['d_single']:.1e}")
        scale = max(float(b["logits"].abs().max()), 1.0)
        check(b["d_single"] <= 1e-4 * scale, f"batch differs from single runs ({b['d_single']})")
        check(b["label_diff"] > 0.2, "the two batch images give nearly the same labels")
        # The other encodings of the same weights must give bit-identical logits.
        for p in files[1:3]:
            m2 = s2.load_strict(p, fx.cfg)
            check(all(torch.equal(a, c) and a.dtype == c.dtype for a, c in
                      zip(m2.state_dict().values(), model.state_dict().values())),
                  f"{p.name}: loaded weights differ from s2_tiny")
            with torch.no_grad():
                d = float((m2(b["x"]) - b["logits"]).abs().max())
            check(d == 0.0, f"{p.name}: logits differ from s2_tiny (max diff {d})")
            log(f"[{fx.name}] {p.name}: strict load, logits max diff vs s2_tiny {d}")
    t0 = time.time()
    stats = []
    for stem in stems:
        s = write_image_reference(fx, model, imgs[stem], ref_dir / stem,
                                  with_trace=tiny and stem == TINY_TRACE_STEM)
        log_stats(fx.name, s, log)
        stats.append(s)
    check_variety(fx.name, stats)
    log(f"[{fx.name}] 1024x768 references in {time.time() - t0:.1f}s; "
        f"{fx.name} total {time.time() - t_all:.1f}s")
    return files


def build_sapiens2(out_dir, names=None, images=None, log=print, wide_depth: int = 18) -> dict:
    """Build the Sapiens2 fixtures named (default: s2_tiny) under out_dir. Raises FixtureError
    on a failed self-check. Returns {"files": [...]}"""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(S2_DEFAULT if names is None else names)
    unknown = [n for n in names if n not in S2_NAMES]
    check(not unknown, f"unknown Sapiens2 fixtures {unknown}; known: {list(S2_NAMES)}")
    files: list[Path] = []
    for name in names:
        if name in FULL_SIZES:
            files += build_full(name, out_dir, log)
            continue
        fx = tiny_fixture() if name == "s2_tiny" else wide_fixture(wide_depth)
        files += build_one(fx, out_dir, images, log)
    return {"files": files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--only", nargs="+", choices=S2_NAMES, default=None,
                    help="build only these fixtures (default: s2_tiny)")
    ap.add_argument("--s2-wide-depth", type=int, default=18,
                    help="number of blocks of s2_wide_0.4b (default 18; 24 is the real depth)")
    ap.add_argument("--images", nargs="*", type=Path, default=[],
                    help="image files to use instead of <out>/images (matched by stem)")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        res = build_sapiens2(args.out, args.only, args.images, wide_depth=args.s2_wide_depth)
    except FixtureError as e:
        print(f"sapiens2_fixtures: self-check FAILED: {e}", file=sys.stderr)
        return 1
    print("\nfiles:")
    for p in res["files"]:
        print(f"  {p.stat().st_size:>12,d}  {mf.sha256_file(p)[:12]}  {p}")
    print(f"total {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
