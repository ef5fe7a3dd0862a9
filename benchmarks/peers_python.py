#!/usr/bin/env python3
"""The runtimes a CPU user would pick instead of this library, as speed_check workers.

Each column is one process speaking original_python.py's protocol (JSON commands on stdin, one
reply per line), with the same demo pre- and post-processing around a different network runtime,
so the columns differ only in what runs the network:

- `onnxruntime`: ONNX Runtime's CPU provider on the project's ONNX export (tools/export_onnx.py),
  graph optimisation ORT_ENABLE_ALL, intra-op threads as the other columns;
- `openvino` (f32): OpenVINO's CPU plugin on the same export, INFERENCE_PRECISION_HINT=f32;
- `openvino-default`: the same with OpenVINO's default precision for this CPU (bf16 where the CPU
  has AVX512-BF16 or AMX, f16 on some others, else f32); the precision it chose is recorded;
- `transformers` (Sapiens2 only): Hugging Face transformers' Sapiens2ForSemanticSegmentation on
  the same file, renamed by transformers' own conversion from the authors' key names
  (conversion_mapping "sapiens2"), float32, SDPA attention.

    python benchmarks/peers_python.py --runtime onnxruntime --model FILE --onnx FILE.onnx --worker
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import original_python as op  # noqa: E402

RUNTIMES = ("onnxruntime", "openvino", "openvino-default", "transformers")


def threads() -> int:
    return torch.get_num_threads()


class OnnxRuntime(op.DemoPipeline):
    def __init__(self, path: str, device: str, onnx: str) -> None:
        super().__init__(path, device)
        import onnxruntime as ort  # noqa: PLC0415

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads()
        so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
        self.input = self.sess.get_inputs()[0].name
        self.size = tuple(self.sess.get_inputs()[0].shape[2:4])  # the export's input size
        self.backend = {"mode": "onnxruntime", "device": "cpu", "dtype": "float32",
                        "runtime": "onnxruntime " + ort.__version__}
        self.extra = {"versions": {"onnxruntime": ort.__version__}}

    def network(self, batch: torch.Tensor) -> torch.Tensor:
        out = self.sess.run(None, {self.input: batch.numpy()})[0]
        return torch.from_numpy(out)


class OpenVino(op.DemoPipeline):
    def __init__(self, path: str, device: str, onnx: str, precision: str | None) -> None:
        super().__init__(path, device)
        import openvino as ov  # noqa: PLC0415

        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": threads(), "PERFORMANCE_HINT": "LATENCY"}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        self.compiled = core.compile_model(core.read_model(onnx), "CPU", config)
        self.request = self.compiled.create_infer_request()
        shape = self.compiled.input(0).get_partial_shape()
        self.size = (shape[2].get_length(), shape[3].get_length())
        chosen = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        chosen = chosen.get_type_name() if hasattr(chosen, "get_type_name") else str(chosen)
        names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
        self.backend = {"mode": "openvino", "device": "cpu",
                        "dtype": names.get(chosen, chosen),
                        "runtime": "openvino " + ov.__version__}
        caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        self.extra = {"versions": {"openvino": ov.__version__},
                      "inference_precision": chosen,
                      "precision_requested": precision or "default",
                      "openvino_cpu_capabilities": [str(c) for c in caps]}

    def network(self, batch: torch.Tensor) -> torch.Tensor:
        out = self.request.infer({0: batch.numpy()})
        return torch.from_numpy(np.array(next(iter(out.values()))))


def hf_config(path: str):
    """A Sapiens2Config for the file, from its tensor shapes (what the hub's config.json holds)."""
    from safetensors import safe_open  # noqa: PLC0415
    from transformers import Sapiens2Config  # noqa: PLC0415

    with safe_open(path, framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    if "backbone.cls_token" not in shapes:
        raise ValueError("transformers' column converts the authors' key names; this file has "
                         "other names")
    c = shapes["backbone.patch_embed.projection.weight"][0]
    depth = 1 + max(int(k.split(".")[2]) for k in shapes if k.startswith("backbone.blocks."))
    hd = shapes["backbone.blocks.0.attn.q_norm.weight"][0]
    kv = [shapes[f"backbone.blocks.{i}.attn.wk.weight"][0] // hd for i in range(depth)]
    return Sapiens2Config(
        hidden_size=c, intermediate_size=shapes["backbone.blocks.0.ffn.w3.weight"][1],
        num_hidden_layers=depth, num_attention_heads=c // hd, num_key_value_heads_per_layer=kv,
        image_size=[1024, 768], num_labels=shapes["decode_head.conv_seg.weight"][0],
        head_config={"upsample_out_channels": [shapes[f"decode_head.deconv_layers.{j}.weight"][1]
                                               for j in (0, 3, 6, 9)],
                     "conv_out_channels": [shapes[f"decode_head.conv_layers.{j}.weight"][0]
                                           for j in (0, 3)]},
    )


class Transformers(op.DemoPipeline):
    def __init__(self, path: str, device: str) -> None:
        super().__init__(path, device)
        if not self.sapiens2:
            raise ValueError("transformers has no Sapiens v1 model")
        import transformers  # noqa: PLC0415
        from transformers import Sapiens2ForSemanticSegmentation  # noqa: PLC0415

        cfg = hf_config(path)
        # from_pretrained reads a folder: the config and the authors' file under its own name.
        with tempfile.TemporaryDirectory(prefix="sapiens2_hf_") as d:
            cfg.save_pretrained(d)
            os.symlink(os.path.abspath(path), os.path.join(d, "model.safetensors"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.model, info = Sapiens2ForSemanticSegmentation.from_pretrained(
                    d, dtype=torch.float32, attn_implementation="sdpa",
                    output_loading_info=True)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys")}
        if bad:
            raise ValueError(f"transformers' conversion left {bad}")
        self.model.eval().to(self.device)
        self.backend = {"mode": "transformers", "device": str(self.device), "dtype": "float32",
                        "runtime": "transformers " + transformers.__version__}
        self.extra = {"versions": {"transformers": transformers.__version__},
                      "unexpected_keys": sorted(info.get("unexpected_keys", []))}

    def network(self, batch: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=batch).logits


def factory_for(args: argparse.Namespace):
    rt = args.runtime
    if rt in ("onnxruntime", "openvino", "openvino-default") and not args.onnx:
        raise SystemExit(f"--runtime {rt} needs --onnx FILE (tools/export_onnx.py)")
    if rt == "onnxruntime":
        return lambda path, dev: OnnxRuntime(path, dev, args.onnx)
    if rt == "openvino":
        return lambda path, dev: OpenVino(path, dev, args.onnx, "f32")
    if rt == "openvino-default":
        return lambda path, dev: OpenVino(path, dev, args.onnx, None)
    if rt == "transformers":
        return Transformers
    raise SystemExit(f"unknown runtime {rt}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", required=True, choices=RUNTIMES)
    ap.add_argument("--model", required=True, help="the checkpoint (.pt2 or .safetensors)")
    ap.add_argument("--onnx", help="its ONNX export (onnxruntime, openvino)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--load-repeats", type=int, default=1)
    ap.add_argument("--worker", action="store_true", help="serve speed_check's commands")
    args = ap.parse_args(argv)
    if args.device != "cpu":
        raise SystemExit("the peers run on the CPU")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    factory = factory_for(args)
    if args.worker:
        return op.serve(args, factory)
    worker = op.Worker(args.model, args.device, args.load_repeats, factory)
    print(json.dumps(worker.ready(), indent=2))
    prep = worker.prepare(1024, 768, 1, 1)
    print(json.dumps({**prep, **worker.run(1), **op.peak(worker.device)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
