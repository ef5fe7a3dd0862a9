#!/usr/bin/env python3
"""Write the seed corpus of the TorchScript archive fuzz target (tests/fuzz/corpus_torchscript).

Every seed is a real archive written by the torch of the project's venv (torch.jit.save and
torch.save in several styles), re-packed variants (deflated, zip64, without the byteorder record that
older torch releases did not write) and a few damaged ones, each under 64 KiB (the target's -max_len). Run it
again after a torch upgrade and commit the result:

    .venv/bin/python tests/fuzz/make_torchscript_seeds.py tests/fuzz/corpus_torchscript

What the seeds cover is listed in tests/fuzz/README.md.
"""

from __future__ import annotations

import io
import struct
import sys
import warnings
import zipfile
import zlib
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the fixture makers
from fixtures import sapiens_v1 as mf  # noqa: E402

warnings.filterwarnings("ignore")
MAX_SEED = 65536


class Dtypes(nn.Module):
    """Buffers of every storage type the reader knows, a non-contiguous view and a shared
    storage with an offset."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(4, 3, generator=g))
        for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16), ("f64", torch.float64),
                         ("i64", torch.int64), ("i32", torch.int32), ("i16", torch.int16),
                         ("i8", torch.int8), ("u8", torch.uint8)):
            self.register_buffer(name, (torch.arange(6) - 2).to(dt))
        self.register_buffer("flag", torch.tensor([True, False, True]))
        base = torch.randn(5, 4, generator=g)
        self.register_buffer("t_view", base.t())  # strides (1, 4)
        self.register_buffer("tail", base.view(-1)[7:])  # shares nothing after save: offset 7
        self.register_buffer("scalar", torch.tensor(3.5))
        self.register_buffer("empty", torch.zeros(0, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


def jit_bytes(module: torch.jit.ScriptModule) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    return buf.getvalue()


def save_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def records(blob: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return [(i, z.read(i)) for i in z.infolist()]


def rezip(blob: bytes, method: int, drop: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as dst:
        for info, data in records(blob):
            if not info.filename.endswith(drop):
                dst.writestr(info.filename, data, compress_type=method)
    return buf.getvalue()


def zip64(blob: bytes) -> bytes:
    """The same records with every size and offset in zip64 fields, as writers lay out files
    over 4 GiB: saturated 32-bit fields, a zip64 extra field per entry, the zip64
    end-of-central-directory record and its locator."""
    out, central = bytearray(), bytearray()
    entries = records(blob)
    for info, data in entries:
        name = info.filename.encode()
        crc = zlib.crc32(data)
        offset = len(out)
        out += struct.pack("<4sHHHHHIII HH", b"PK\x03\x04", 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                           0xFFFFFFFF, len(name), 20)
        out += name + struct.pack("<HHQQ", 1, 16, len(data), len(data)) + data
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(name), 28, 0, 0, 0, 0, 0xFFFFFFFF)
        central += name + struct.pack("<HHQQQ", 1, 24, len(data), len(data), offset)
    cd_offset = len(out)
    out += central
    z64 = len(out)
    out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, len(entries),
                       len(entries), len(central), cd_offset)
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, z64, 1)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


def flip_in_record(blob: bytes, suffix: str) -> bytes:
    """One bit flipped in the first record whose name ends with `suffix` (its CRC then fails)."""
    data = bytearray(blob)
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    h = info.header_offset
    start = h + 30 + int.from_bytes(data[h + 26:h + 28], "little") + \
        int.from_bytes(data[h + 28:h + 30], "little")
    data[start + info.compress_size // 2] ^= 0x04
    return bytes(data)


def tiny_sapiens() -> bytes:
    """The authors' module tree (the v1 fixtures' network) at the smallest widths: the module
    names, mangled ModuleList classes and code records of a real checkpoint."""
    cfg = mf.FixtureConfig("seed", "seed", "fuzz seed", embed_dim=4, depth=1, heads=2, mlp=8,
                           head_channels=4, height=32, width=32, seed=5)
    model = mf.build_model(cfg).eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, mf.example_input(cfg), check_trace=False)
    return jit_bytes(traced)


def main(out_dir: Path) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    scripted = jit_bytes(torch.jit.script(Dtypes()))
    traced_linear = jit_bytes(torch.jit.trace(nn.Sequential(nn.Linear(3, 2), nn.ReLU()),
                                              torch.zeros(1, 3)))
    # Without its debug records (never read) and torch's 64-byte alignment padding, to fit.
    sapiens = rezip(tiny_sapiens(), zipfile.ZIP_STORED, drop=(".debug_pkl",))
    state = save_bytes(Dtypes().state_dict())
    seeds = {
        "jit_script_dtypes.pt": scripted,
        "jit_trace_linear.pt": traced_linear,
        "jit_trace_sapiens_tiny_nodebug.pt2": sapiens,
        "jit_script_deflated.pt": rezip(scripted, zipfile.ZIP_DEFLATED),
        "jit_trace_sapiens_deflated.pt2": rezip(sapiens, zipfile.ZIP_DEFLATED),
        "jit_script_zip64.pt": zip64(scripted),
        "jit_no_byteorder.pt": rezip(traced_linear, zipfile.ZIP_STORED, drop=("/byteorder",)),
        "torch_save_state_dict.pt": state,
        "bad_flipped_tensor_byte.pt": flip_in_record(scripted, "/data/0"),
        "bad_flipped_pickle_byte.pt": flip_in_record(traced_linear, "/data.pkl"),
        "bad_truncated.pt": scripted[: len(scripted) * 2 // 3],
    }
    # torch.save without CRCs (data descriptors, CRC fields 0), where this torch has the option.
    if hasattr(torch.serialization, "set_crc32_options"):
        torch.serialization.set_crc32_options(False)
        try:
            seeds["torch_save_no_crc.pt"] = save_bytes({"w": torch.ones(3)})
        finally:
            torch.serialization.set_crc32_options(True)
    for name, blob in seeds.items():
        assert len(blob) <= MAX_SEED, f"{name} is {len(blob)} bytes, over {MAX_SEED}"
        (out_dir / name).write_bytes(blob)
        print(f"{len(blob):>7} {name}")
    print(f"torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus_torchscript")))
