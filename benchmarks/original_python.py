#!/usr/bin/env python3
"""Time a Sapiens checkpoint the way the authors' demo runs it.

Sapiens v1 (`*_torchscript.pt2`), the Sapiens-Lite demo (facts from the project's network spec,
section 5.1): cv2.resize of the BGR image to 1024x768 with INTER_LINEAR, BGR->RGB, (x - mean) / std
with the demo's rounded values, the traced model in float32 under torch.no_grad(), then per image
one F.interpolate (bilinear, align_corners=False) of the logits to the image size and an argmax
over the classes. Nothing is fused or tiled: at 3000x4000 the full-resolution logits (28 x 12 MP
in float32, 1.3 GB) exist, as they do in the demo.

Sapiens2 (`*.safetensors`), the authors' demo (spec sapiens2.md section 5): their module tree,
here the project's own definition of it (tests/reference/sapiens2.py), built in float32 and
filled the authors' way (safetensors `load_file`, then `load_state_dict`, so the weights exist
twice while loading); cv2 INTER_AREA when the width shrinks, else INTER_CUBIC, to 1024x768,
ImageNet mean/std, the module in float32 (bf16 RoPE), F.interpolate of the 29 x 1024 x 768
logits, argmax.

Each call also records the network's own time (`net_ms`), without the pre- and post-processing.

The protocol is the project's (design section 7): load time, first call, warm-up calls, a reset
of the peak-memory counter, then rounds x calls with the median of each round and the median of
those. Images are synthetic and deterministic (the same pattern speed_check feeds the C++ modes).

Standalone:
    python benchmarks/original_python.py --model FILE.pt2 [--sizes 480x640,3000x4000]
        [--batch 1,8] [--rounds 3] [--calls 5] [--warmup 3] [--threads N] [--json OUT]
As speed_check's worker (--worker): JSON commands on stdin, one JSON reply per line on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings

import cv2
import numpy as np
import torch
import torch.nn.functional as F

MEAN = (123.5, 116.5, 103.5)  # the Sapiens-Lite demo's values, RGB order
STD = (58.5, 57.0, 57.5)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(REPO, "tools")  # the ONNX export's configuration reader
TESTS = os.path.join(REPO, "tests")  # the tests' oracles (reference.sapiens2)


def synthetic_rgb(height: int, width: int, index: int) -> np.ndarray:
    """The benchmark pattern, uint8 RGB [H, W, 3]: two gradients and a diagonal texture, shifted
    per batch index. speed_check draws the same one."""
    x = np.arange(width, dtype=np.int64)[None, :]
    y = np.arange(height, dtype=np.int64)[:, None]
    r = (x * 255) // max(width - 1, 1) + 0 * y
    g = (y * 255) // max(height - 1, 1) + 0 * x
    b = ((x + y) * 7 + index * 31) % 256
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def vm_status(field: str) -> int:
    """A VmXXX line of /proc/self/status in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss() -> None:
    """Writing 5 to clear_refs resets VmHWM to the current RSS (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def is_sapiens2(path: str) -> bool:
    return path.endswith(".safetensors")


class DemoPipeline:
    """The demo's pre- and post-processing around a network; subclasses supply `network`.

    v1: cv2 INTER_LINEAR to 1024x768 and the Sapiens-Lite mean/std; v2: INTER_AREA when the width
    shrinks, else INTER_CUBIC, and the ImageNet mean/std. Then one F.interpolate of the logits
    per image and an argmax, as both demos do."""

    backend: dict = {}

    def __init__(self, path: str, device: str) -> None:
        self.device = torch.device(device)
        self.sapiens2 = is_sapiens2(path)
        mean, std = ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)) if self.sapiens2 \
            else (MEAN, STD)
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)
        self.last_net_ms = 0.0
        self.size = (1024, 768)  # the network input, H x W (both demos)

    def preprocess(self, img_bgr: np.ndarray) -> torch.Tensor:
        h, w = self.size
        if self.sapiens2:
            interp = cv2.INTER_AREA if w < img_bgr.shape[1] else cv2.INTER_CUBIC
        else:
            interp = cv2.INTER_LINEAR
        resized = cv2.resize(img_bgr, (w, h), interpolation=interp)
        t = torch.from_numpy(resized).permute(2, 0, 1)[[2, 1, 0]].float()
        return (t - self.mean) / self.std

    def network(self, batch: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, images_bgr: list[np.ndarray], with_logits: bool = False):
        with torch.no_grad():
            batch = torch.stack([self.preprocess(im) for im in images_bgr]).to(self.device)
            sync(self.device)
            t0 = time.perf_counter()
            logits = self.network(batch)
            sync(self.device)
            self.last_net_ms = (time.perf_counter() - t0) * 1e3
            labels = []
            for i, im in enumerate(images_bgr):
                h, w = im.shape[:2]
                up = F.interpolate(logits[i:i + 1], size=(h, w), mode="bilinear")
                labels.append(up.argmax(dim=1)[0].cpu().numpy())
        return (labels, logits.float().cpu()) if with_logits else labels


class Original(DemoPipeline):
    """Sapiens v1: the TorchScript file run as the Sapiens-Lite demo runs it."""

    def __init__(self, path: str, device: str) -> None:
        super().__init__(path, device)
        self.model = torch.jit.load(path, map_location="cpu")
        self.model.eval()
        self.model.to(self.device)
        self.backend = {"mode": "original-python", "device": str(self.device),
                        "dtype": "float32", "runtime": "torch.jit " + torch.__version__}

    def network(self, batch: torch.Tensor) -> torch.Tensor:
        return self.model(batch)


class OriginalSapiens2(DemoPipeline):
    """Sapiens2: the authors' module tree in float32, loaded the way their init_model loads it
    (build the module, safetensors load_file, load_state_dict)."""

    def __init__(self, path: str, device: str) -> None:
        super().__init__(path, device)
        sys.path[:0] = [TESTS, TOOLS]
        from export_onnx import v2_config  # noqa: PLC0415
        from reference import sapiens2 as s2  # noqa: PLC0415 - the tests' oracle
        from safetensors import safe_open  # noqa: PLC0415
        from safetensors.torch import load_file  # noqa: PLC0415

        with safe_open(path, framework="pt") as f:  # shapes only, for the configuration
            shapes = {k: torch.empty(f.get_slice(k).get_shape(), device="meta")
                      for k in f.keys()}
        if s2.is_hf_state_dict(shapes):
            raise ValueError("the original runs the authors' key names; this file has Hugging "
                             "Face names")
        self.model = s2.Sapiens2Seg(v2_config(shapes))
        sd = load_file(path, device="cpu")
        self.model.load_state_dict(sd, strict=False)  # the authors load non-strictly
        del sd
        self.model.eval().to(self.device)
        self.backend = {"mode": "original-python", "device": str(self.device),
                        "dtype": "float32",
                        "runtime": "torch eager (tests/reference/sapiens2.py) " + torch.__version__}

    def network(self, batch: torch.Tensor) -> torch.Tensor:
        return self.model(batch)


def make_original(path: str, device: str) -> DemoPipeline:
    return OriginalSapiens2(path, device) if is_sapiens2(path) else Original(path, device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def peak(device: torch.device) -> dict:
    out = {"peak_rss": vm_status("VmHWM"), "rss": vm_status("VmRSS")}
    if device.type == "cuda":
        out["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(device)
        out["cuda_peak_reserved"] = torch.cuda.max_memory_reserved(device)
    return out


class Worker:
    """One loaded model answering speed_check's commands (or the standalone driver's).
    `factory(path, device)` builds the pipeline (default: the authors' demo)."""

    def __init__(self, path: str, device: str, load_repeats: int, factory=None) -> None:
        factory = factory or make_original
        loads = []
        self.model = None
        gc.collect()
        rss0 = vm_status("VmRSS")
        reset_peak_rss()
        for _ in range(max(1, load_repeats)):
            self.model = None  # the previous copy goes first, as a fresh process would have it
            gc.collect()
            t0 = time.perf_counter()
            self.model = factory(path, device)
            loads.append((time.perf_counter() - t0) * 1e3)
        self.load_ms = loads
        self.load_peak_rss = vm_status("VmHWM")  # the loading's own peak (weights twice, ...)
        self.rss_before_load = rss0
        self.device = self.model.device
        self.images: list[np.ndarray] = []

    def ready(self) -> dict:
        return {
            "event": "ready", "load_ms": self.load_ms, "threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__,
            "python": platform.python_version(), "opencv": cv2.__version__,
            "backend": self.model.backend, "rss_after_load": vm_status("VmRSS"),
            "rss_before_load": self.rss_before_load, "load_peak_rss": self.load_peak_rss,
            **getattr(self.model, "extra", {}),
        }

    def prepare(self, height: int, width: int, batch: int, warmup: int) -> dict:
        # The demo reads BGR files; the pattern is drawn in RGB and flipped as imread would.
        self.images = [np.ascontiguousarray(synthetic_rgb(height, width, i)[:, :, ::-1])
                       for i in range(batch)]
        first = timed(lambda: self.model(self.images), self.device)
        warm = [timed(lambda: self.model(self.images), self.device) for _ in range(warmup)]
        reset_peak_rss()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return {"first_ms": first, "warmup_ms": warm}

    def run(self, calls: int) -> dict:
        ms, cpu, net = [], [], []
        for _ in range(calls):
            c0 = time.process_time()  # all threads of the process
            ms.append(timed(lambda: self.model(self.images), self.device))
            cpu.append((time.process_time() - c0) * 1e3)
            net.append(self.model.last_net_ms)
        return {"ms": ms, "cpu_ms": cpu, "net_ms": net}

    def handle(self, cmd: dict) -> dict:
        kind = cmd.get("cmd")
        if kind == "prepare":
            return self.prepare(int(cmd["height"]), int(cmd["width"]), int(cmd["batch"]),
                                int(cmd.get("warmup", 3)))
        if kind == "run":
            return self.run(int(cmd["calls"]))
        if kind == "peak":
            return peak(self.device)
        if kind == "outputs":
            # Raw float32 logits and uint8 labels of one image, for speed_check to compare.
            h, w = int(cmd["height"]), int(cmd["width"])
            image = np.ascontiguousarray(synthetic_rgb(h, w, 0)[:, :, ::-1])
            labels, logits = self.model([image], with_logits=True)
            logits[0].numpy().astype(np.float32).tofile(cmd["prefix"] + ".logits")
            labels[0].astype(np.uint8).tofile(cmd["prefix"] + ".labels")
            return {"logits": int(logits[0].numel()), "labels": int(labels[0].size)}
        raise ValueError(f"unknown command {kind!r}")


def serve(args: argparse.Namespace, factory=None) -> int:
    def reply(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        worker = Worker(args.model, args.device, args.load_repeats, factory)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which shows the column as n/a
        reply({"event": "unavailable", "reason": f"{type(e).__name__}: {e}"})
        return 0
    reply(worker.ready())
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        try:
            reply(worker.handle(cmd))
        except Exception as e:  # noqa: BLE001
            reply({"error": f"{type(e).__name__}: {e}"})
    return 0


def parse_list(text: str, kind):
    return [kind(x) for x in text.split(",") if x]


def parse_size(text: str) -> tuple[int, int]:
    h, w = text.lower().split("x")
    return int(h), int(w)


def standalone(args: argparse.Namespace) -> int:
    worker = Worker(args.model, args.device, args.load_repeats)
    info = worker.ready()
    print(f"loaded in {statistics.median(worker.load_ms):.0f} ms, {info['threads']} threads",
          file=sys.stderr)
    results = []
    for size in parse_list(args.sizes, parse_size):
        for batch in parse_list(args.batch, int):
            prep = worker.prepare(size[0], size[1], batch, args.warmup)
            rounds = [worker.run(args.calls)["ms"] for _ in range(args.rounds)]
            med = statistics.median(statistics.median(r) for r in rounds)
            entry = {"height": size[0], "width": size[1], "batch": batch, **prep,
                     "rounds_ms": rounds, "median_ms": med, **peak(worker.device)}
            print(f"{size[0]}x{size[1]} batch {batch}: {med:.1f} ms "
                  f"(peak RSS {entry['peak_rss'] / 2**30:.2f} GiB)", file=sys.stderr)
            results.append(entry)
    out = {"meta": {"model": args.model, "device": args.device, "date": time.strftime("%Y-%m-%d"),
                    "protocol": {"warmup": args.warmup, "rounds": args.rounds,
                                 "calls": args.calls},
                    **{k: v for k, v in info.items() if k != "event"}},
           "results": results}
    text = json.dumps(out, indent=2)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True,
                    help="a Sapiens v1 *_torchscript.pt2 or a Sapiens2 *.safetensors file")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--load-repeats", type=int, default=1)
    ap.add_argument("--worker", action="store_true", help="serve speed_check's commands")
    ap.add_argument("--sizes", default="480x640,720x1280,1080x1920,1024x2048,3000x4000")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--json", help="write the results here (default: stdout)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # torch.jit.* warns on every call that TorchScript is deprecated; it is the format of the
    # checkpoints being timed.
    warnings.filterwarnings("ignore", category=FutureWarning)
    return serve(args) if args.worker else standalone(args)


if __name__ == "__main__":
    sys.exit(main())
