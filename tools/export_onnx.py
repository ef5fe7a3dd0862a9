#!/usr/bin/env python3
"""Export a Sapiens checkpoint to ONNX from the project's own PyTorch definitions, and check the
export's logits against the original before anyone times it.

The CPU runtimes a user would try instead of this library (ONNX Runtime, OpenVINO) take ONNX.
The export is built from the project's definitions of the authors' networks, never from the
authors' code: Sapiens v1 from `reference.sapiens_v1.SapiensV1Seg` with the TorchScript file's
weights, Sapiens2 from `reference.sapiens2.Sapiens2Seg` with the .safetensors file's weights
(authors' or Hugging Face key names), both in tests/reference/. Then ONNX Runtime runs the
export on one input and its logits are compared with the original's: v1 the TorchScript file
itself (torch.jit.load), v2 the reference module (the authors' numerics, bf16 RoPE included). The
max |diff| goes into a JSON file beside the export (`<out>.json`). v1 must be within --tolerance
(the CPU fp32 bar, 0.002). Sapiens2's bf16 RoPE makes its fp32 network discontinuous (a last-bit
change upstream flips roundings of q and k), so its bound is the larger of the tolerance and
twice what the reference itself moves under a one-ulp change of its input, measured here and
recorded; labels must agree on 99.5 %.

Sapiens2's RoPE runs in bfloat16 in the authors' fp32 model (spec sapiens2.md section 8.2). ONNX
runtimes have no bfloat16 sin/cos/mul on the CPU, so the export holds the bf16 tables computed
by the reference (exact in fp32) and rounds q, k and each product and sum to bfloat16 with
Cast pairs: the same roundings, in ops every runtime has.

    python tools/export_onnx.py --model FILE.pt2|FILE.safetensors --out FILE.onnx
        [--opset 17] [--tolerance 0.002] [--batch-dynamic]

Large models (Sapiens2 1b: 5.9 GB) are written with ONNX external data beside the .onnx file.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# The tests' oracles (tests/reference/): the project's definitions of both networks.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reference import sapiens2 as s2  # noqa: E402
from reference import sapiens_v1 as v1  # noqa: E402


class ExportError(RuntimeError):
    """The export failed or does not match the original."""


# ---------------------------------------------------------------------------------------------
# Sapiens v1: the project's module with the TorchScript file's weights
# ---------------------------------------------------------------------------------------------


def v1_heads(script: torch.jit.ScriptModule) -> int:
    """Heads from the traced attention's qkv reshape ([b, n, 3, heads, head_dim])."""
    code = dict(script.named_modules())["backbone.layers.0.attn"].code
    m = re.search(r"reshape\(\(qkv\)\.forward\([^)]*\), \[\w+, \w+, 3, (\d+), (\d+)\]\)", code)
    if not m:
        raise ExportError("cannot find the attention's head count in the traced graph")
    return int(m.group(1))


def v1_model(path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule, tuple[int, int]]:
    """(eager SapiensV1Seg holding the file's tensors, the loaded TorchScript, input H x W)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        script = torch.jit.load(str(path), map_location="cpu").eval()
    sd = {k: v for k, v in script.state_dict().items() if not k.startswith("data_preprocessor.")}
    c = sd["backbone.patch_embed.projection.weight"].shape[0]
    n = sd["backbone.pos_embed"].shape[1]
    depth = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("backbone.layers."))
    mlp = sd["backbone.layers.0.ffn.layers.0.0.weight"].shape[0]
    hc = sd["decode_head.conv_seg.weight"].shape[1]
    classes = sd["decode_head.conv_seg.weight"].shape[0]
    gh = round(math.sqrt(n * 4 / 3))  # the released grids are 4:3 (64 x 48 at 1024 x 768)
    if n % gh:
        raise ExportError(f"pos_embed has {n} tokens, not a 4:3 grid")
    grid = (gh, n // gh)
    with torch.device("meta"):
        model = v1.SapiensV1Seg(c, depth, v1_heads(script), mlp, hc, grid, classes)
    model.load_state_dict(sd, strict=True, assign=True)  # shares the script's tensors
    model.data_preprocessor = v1.SegDataPreProcessor()  # non-persistent, not in the file
    return model.eval(), script, (grid[0] * v1.PATCH, grid[1] * v1.PATCH)


# ---------------------------------------------------------------------------------------------
# Sapiens2: the reference module, with an ONNX-friendly bf16 RoPE
# ---------------------------------------------------------------------------------------------


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """Round an fp32 tensor to bfloat16 and back (two Casts in ONNX)."""
    return t.to(torch.bfloat16).to(torch.float32)


def apply_rope_onnx(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """s2.apply_rope with the bf16 arithmetic done in fp32 plus a rounding after each step.

    A product of two bf16 values is exact in fp32, and PyTorch's CPU bf16 ops compute in fp32
    and round, so rounding after each product and after the sum gives the same bits."""
    sin, cos = rope  # fp32 tensors holding bf16 values
    out = []
    for t in (q, k):
        t = _bf16(t)
        prefix = t.shape[-2] - sin.shape[-2]
        p = t[:, :, prefix:]
        rotated = _bf16(_bf16(p * cos) + _bf16(s2.rotate_half(p) * sin))
        out.append(torch.cat((t[:, :, :prefix], rotated), dim=-2))
    return out[0], out[1]


class FixedRope(torch.nn.Module):
    """The reference's bf16 RoPE tables for one grid, stored as fp32 constants."""

    def __init__(self, periods: torch.Tensor, hp: int, wp: int) -> None:
        super().__init__()
        sin, cos = s2.rope_tables(periods.to(s2.ROPE_DTYPE), hp, wp)
        self.register_buffer("sin", sin.float(), persistent=False)
        self.register_buffer("cos", cos.float(), persistent=False)
        self.periods = periods  # kept for state_dict parity; unused in forward

    def forward(self, hp: int, wp: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sin, self.cos


def v2_state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd = load_file(str(path), device="cpu")
    return sd


def v2_config(sd: dict[str, torch.Tensor]) -> s2.Sapiens2Config:
    c = sd["backbone.patch_embed.projection.weight"].shape[0]
    depth = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("backbone.blocks."))
    hd4 = None
    if s2.PERIODS_KEY in sd:
        hd4 = sd[s2.PERIODS_KEY].shape[0]
    q_norm = sd["backbone.blocks.0.attn.q_norm.weight"].shape[0]  # head_dim
    heads = c // q_norm
    if hd4 is not None and hd4 * 4 != q_norm:
        raise ExportError(f"periods has {hd4} entries but the head dim is {q_norm}")
    mlp = sd["backbone.blocks.0.ffn.w3.weight"].shape[1]
    deconv = tuple(sd[f"decode_head.deconv_layers.{j}.weight"].shape[1] for j in (0, 3, 6, 9))
    conv = tuple(sd[f"decode_head.conv_layers.{j}.weight"].shape[0] for j in (0, 3))
    classes = sd["decode_head.conv_seg.weight"].shape[0]
    return s2.Sapiens2Config(c, depth, heads, mlp, deconv, conv, classes)


def v2_model(path: Path) -> tuple[s2.Sapiens2Seg, s2.Sapiens2Config]:
    """The reference module holding the file's tensors (no second copy: assign=True). periods
    goes into the module's bf16 buffer as the authors' load_state_dict copies it there."""
    sd = v2_state_dict(path)
    if s2.is_hf_state_dict(sd):
        head_dim = sd["model.layer.0.attention.q_norm.weight"].shape[0]
        sd = s2.hf_to_original(sd, head_dim=head_dim)
    cfg = v2_config(sd)
    s2.check_state_dict(sd, cfg)
    sd[s2.PERIODS_KEY] = sd[s2.PERIODS_KEY].to(s2.ROPE_DTYPE)
    with torch.device("meta"):
        model = s2.Sapiens2Seg(cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    return model.eval(), cfg


class DecomposedRMSNorm(torch.nn.Module):
    """nn.RMSNorm over the last dim in plain ops: the TorchScript exporter has no aten::rms_norm
    below opset 23, which the runtimes' CPU plugins do not all read yet."""

    def __init__(self, norm: torch.nn.RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def decompose_rms_norms(module: torch.nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.RMSNorm):
            if len(child.normalized_shape) != 1:
                raise ExportError(f"{name}: RMSNorm over {child.normalized_shape}")
            setattr(module, name, DecomposedRMSNorm(child))
        else:
            decompose_rms_norms(child)


class OnnxSapiens2(torch.nn.Module):
    """The reference network for one input size, with the RoPE above swapped in and RMSNorm in
    plain ops. Changes `model` in place (the export is the last use)."""

    def __init__(self, model: s2.Sapiens2Seg, height: int, width: int) -> None:
        super().__init__()
        self.inner = model
        periods = model.backbone.rope_embed.periods
        model.backbone.rope_embed = FixedRope(periods, height // s2.PATCH, width // s2.PATCH)
        decompose_rms_norms(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        saved = s2.apply_rope
        s2.apply_rope = apply_rope_onnx  # GroupedQueryAttention looks it up at call time
        try:
            return self.inner(x)
        finally:
            s2.apply_rope = saved


# ---------------------------------------------------------------------------------------------
# Export and check
# ---------------------------------------------------------------------------------------------


def example_input(h: int, w: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A normalised-looking input: N(0, 1), deterministic."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, h, w, generator=g)


def onnx_logits(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def export(model_path: Path, out: Path, opset: int = 17, tolerance: float = 2e-3,
           log=print) -> dict:
    """Export `model_path` to `out` and check it; returns what is written to `<out>.json`."""
    t0 = time.time()
    family = "sapiens2" if model_path.suffix == ".safetensors" else "sapiens_v1"
    sensitivity = None
    with torch.inference_mode(False), torch.no_grad():
        if family == "sapiens_v1":
            model, script, (h, w) = v1_model(model_path)
            net = model
        else:
            model, cfg = v2_model(model_path)
            h, w = 1024, 768  # the demo's network input
            script = None
        x = example_input(h, w)
        # The original's logits: v1 the TorchScript file, v2 the reference module as is.
        if family == "sapiens_v1":
            ref = script(x)
        else:
            ref = model(x)
            # The authors' bf16 RoPE rounds q and k inside an fp32 network, so a last-bit change
            # anywhere upstream flips some roundings: the reference itself moves this much when
            # its input moves by one ulp. No other runtime's fp32 sums are bit-identical to
            # PyTorch's, so this, not the fp32 bar, bounds what an exact export can reach.
            nudged = torch.nextafter(x, torch.full_like(x, math.inf))
            sensitivity = float((model(nudged) - ref).abs().max())
            net = OnnxSapiens2(model, h, w)
        log(f"[export] {model_path.name}: {family}, input {h}x{w}, built in {time.time() - t0:.1f}s")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        t1 = time.time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, (x,), str(tmp), dynamo=False, opset_version=opset,
                              input_names=["input"], output_names=["logits"],
                              dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                              do_constant_folding=True)
        export_s = time.time() - t1
    # External data (models over 2 GB) lands beside tmp under its own names; keep them.
    tmp.replace(out)
    got = onnx_logits(out, x.numpy())
    ref_np = ref.float().numpy()
    if got.shape != ref_np.shape:
        raise ExportError(f"export logits {got.shape}, original {ref_np.shape}")
    diff = np.abs(got.astype(np.float64) - ref_np)
    labels_equal = float((got.argmax(1) == ref_np.argmax(1)).mean())
    info = {
        "model_file": model_path.name, "model_bytes": model_path.stat().st_size,
        "family": family, "input": [h, w], "opset": opset, "torch": torch.__version__,
        "exporter": "torch.onnx.export(dynamo=False)",
        "checked_against": "TorchScript file (torch.jit.load)" if family == "sapiens_v1"
        else "tests/reference/sapiens2.py module (authors' numerics, bf16 RoPE)",
        "checked_with": "onnxruntime " + __import__("onnxruntime").__version__ + " (ORT_ENABLE_ALL)",
        "max_abs_logit_diff": float(diff.max()), "mean_abs_logit_diff": float(diff.mean()),
        "label_agreement": labels_equal, "export_s": export_s,
    }
    bound = tolerance
    if sensitivity is not None:
        info["reference_one_ulp_sensitivity"] = sensitivity
        bound = max(tolerance, 2 * sensitivity)
    info["bound"] = bound
    (out.parent / (out.name + ".json")).write_text(json.dumps(info, indent=2) + "\n")
    log(f"[export] {out.name}: exported in {export_s:.1f}s; vs the original max |diff| "
        f"{info['max_abs_logit_diff']:.2e} (bound {bound:.2e}"
        + (f": the reference moves {sensitivity:.2e} under a 1-ulp input change"
           if sensitivity is not None else "") + f"), labels {100 * labels_equal:.2f} % equal")
    if not info["max_abs_logit_diff"] <= bound or labels_equal < 0.995:
        raise ExportError(f"{out.name}: logits differ from the original by "
                          f"{info['max_abs_logit_diff']:.3g} (bound {bound:.3g}), labels "
                          f"{100 * labels_equal:.2f} % equal (>= 99.5 % needed)")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="a .pt2 or .safetensors file")
    ap.add_argument("--out", required=True, type=Path, help="the .onnx file to write")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--tolerance", type=float, default=2e-3,
                    help="max |logit diff| against the original (the CPU fp32 bar)")
    args = ap.parse_args(argv)
    try:
        export(args.model, args.out, args.opset, args.tolerance)
    except (ExportError, s2.CheckpointError) as e:
        print(f"export_onnx: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
