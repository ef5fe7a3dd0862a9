"""No crash, no silent corruption, bounded memory: real-world inputs and resource failures.

The CLI and the Python binding under memory limits (RLIMIT_AS in a subprocess), file names that
are not UTF-8, decompression bombs, phone photos with trailing data, truncated JPEGs, resumed
runs, global flags after the subcommand, and Python lists of any length.

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES), or by hand:

    SAPIENS_SEG_BUILD=$PWD/build SAPIENS_SEG_FIXTURES=$PWD/build/fixtures \\
        .venv/bin/python -m pytest -q tests/python/test_robustness.py
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import FIXTURES, PKG_PARENT, CLI
TINY_A = FIXTURES / "tiny_a_torchscript.pt2"

pytestmark = [
    pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built"),
    pytest.mark.skipif(not TINY_A.exists(), reason=f"no fixtures in {FIXTURES}"),
]

GIB = 1 << 30


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    env.update(extra)
    return env


def cli(*args, limit_bytes: int | None = None, **kw) -> subprocess.CompletedProcess:
    """The CLI with bytes stdout/stderr (file names need not be UTF-8), optionally under an
    address-space limit (what `ulimit -v` sets)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run([os.fsencode(str(a)) if not isinstance(a, bytes) else a
                           for a in (CLI, *args)], capture_output=True, env=clean_env(),
                          timeout=600, preexec_fn=limit if limit_bytes else None, **kw)


def peak_vm(args: list) -> int:
    """VmPeak (bytes) of a CLI run without a limit, polled from /proc until it exits: the
    address space the same run needs, to put a limit just above."""
    p = subprocess.Popen([str(CLI), *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=clean_env())
    peak = 0
    while p.poll() is None:
        try:
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmPeak:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        time.sleep(0.005)
    assert p.returncode == 0
    return peak


def python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A fresh interpreter with this build's package on the path."""
    env = clean_env(PYTHONPATH=str(PKG_PARENT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def write_png(path: Path, h: int, w: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    cv2.ellipse(img, (w // 2, h // 2), (w // 3, h // 4), 0, 0, 360, (30, 180, 220), -1)
    assert cv2.imwrite(str(path), img)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data +
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def real_png_bomb(side: int) -> bytes:
    """A valid side x side black RGB PNG of a few MB, made in a second: 64 zero rows compressed
    once, ending in a full flush (so the block stands alone), repeated; then the rest of the
    rows and the zlib checksum of it all."""
    row = b"\0" * (side * 3 + 1)
    per_block, blocks = 64, side // 64
    c = zlib.compressobj(9)
    first = c.compress(row * per_block) + c.flush(zlib.Z_FULL_FLUSH)
    header, block = first[:2], first[2:]
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = raw.compress(row * (side % per_block)) + raw.flush()
    n = len(row) * side  # every byte is zero (filter bytes too): Adler-32 in closed form
    adler = ((n % 65521) << 16) | 1
    idat = header + block * blocks + tail + struct.pack(">I", adler)
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) +
            png_chunk(b"IEND", b""))


# ---- out of memory: per input, never an abort -------------------------------------------------

def test_out_of_memory_for_full_size_logits_fails_that_input_only(tmp_path):
    # 8000x8000 with --save logits: 28 float32 channels are 7.2 GB, far above the limit; the
    # decoded image, labels and the other input fit. Before: std::terminate (exit 134).
    d = tmp_path / "in"
    d.mkdir()
    big = np.zeros((8000, 8000, 3), np.uint8)
    big[2000:6000, 3000:5000] = (40, 160, 220)
    assert cv2.imwrite(str(d / "big.png"), big)
    write_png(d / "small.png", 64, 80)
    base = peak_vm(["segment", d / "small.png", "-o", tmp_path / "probe", "--model", TINY_A,
                    "--save", "labels,logits,json"])
    out = tmp_path / "out"
    r = cli("segment", d, "-o", out, "--model", TINY_A, "--save", "labels,logits,json", "--json",
            "--threads", "1", limit_bytes=base + 3 * GIB)
    err = r.stderr.decode()
    assert r.returncode == 21, err
    assert "terminate" not in err and "out_of_memory" in err
    entries = {Path(e["input"]).name: e for e in summary_of(out)["images"]}
    assert entries["big.png"]["status"] == "error"
    assert entries["big.png"]["error"] == "out_of_memory"
    assert "logits" in entries["big.png"]["message"]
    assert entries["small.png"]["status"] == "ok"
    assert np.load(out / "small_logits.npy").shape[1:] == (64, 80)
    assert not (out / "big_logits.npy").exists()
    assert not [f for f in out.iterdir() if ".tmp" in f.name]
    lines = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert sorted(e["status"] for e in lines) == ["error", "ok"]


def test_a_batch_too_large_for_memory_runs_again_one_image_at_a_time(tmp_path):
    # 130 images, --batch-size 128, under a limit a few hundred MB above what a batch of 2
    # needs: the big batch cannot fit (its decoded images, network inputs and activations), one
    # image at a time can. A batch that fails is run again image by image, so an image fails only
    # for itself (long ago a raw LibTorch/OpenCV allocation failure escaped the run loop and the
    # process aborted; then the whole batch failed).
    d = tmp_path / "in"
    d.mkdir()
    for i in range(130):
        write_png(d / f"img_{i:03d}.png", 600, 600, seed=i)
    common = ["--model", TINY_A, "--save", "labels,json", "--threads", "1"]
    base = peak_vm(["segment", d / "img_000.png", d / "img_001.png", "-o", tmp_path / "probe",
                    "--batch-size", "2", *common])
    out = tmp_path / "out"
    r = cli("segment", d, "-o", out, "--batch-size", "128", *common,
            limit_bytes=base + 256 * (1 << 20))
    err = r.stderr.decode()
    assert r.returncode in (0, 21), err[-2000:]
    assert "terminate" not in err
    assert "images failed (" in err and "running them one at a time" in err, err[-2000:]
    assert "smaller batch needs less memory" in err, err[-2000:]
    images = summary_of(out)["images"]
    assert sorted(Path(e["input"]).name for e in images) == sorted(p.name for p in d.iterdir())
    failed = [e for e in images if e["status"] == "error"]
    assert {e["error"] for e in failed} <= {"out_of_memory"}
    assert (r.returncode == 21) == bool(failed)
    ok = [e for e in images if e["status"] == "ok"]
    assert len(ok) >= 100, f"only {len(ok)} images were segmented one at a time"
    assert len(list(out.glob("*_seg.png"))) == len(ok)
    assert not [f for f in out.iterdir() if ".tmp" in f.name]


def test_python_out_of_memory_is_an_out_of_memory_error_and_a_memory_error():
    r = python(f"""
        import resource
        import numpy as np
        from sapiens_seg import segmentation, OutOfMemoryError, SapiensSegError, ErrorCode

        model = segmentation.load({str(TINY_A)!r}, mode="portable", device="cpu", threads=1)
        model(np.zeros((64, 64, 3), np.uint8), logits=True)
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
        big = np.zeros((6000, 6000, 3), np.uint8)  # logits: 28 x 36 MP x 4 bytes = 4 GB
        try:
            model(big, logits=True)
            raise SystemExit("no error")
        except MemoryError as e:
            assert isinstance(e, OutOfMemoryError) and isinstance(e, SapiensSegError), type(e)
            assert e.code == ErrorCode.OUT_OF_MEMORY and "logits" in str(e), str(e)
        print("labels", model(big).labels.shape)  # the model is still usable
    """)
    assert r.returncode == 0, r.stderr
    assert "labels (6000, 6000)" in r.stdout


def test_python_lists_are_split_into_batches_so_any_length_fits():
    # Under a limit where 150 images in one network batch cannot fit: the default batch size
    # fits, one batch of 150 raises OutOfMemoryError (never a raw RuntimeError).
    r = python(f"""
        import resource
        import numpy as np
        from sapiens_seg import segmentation, OutOfMemoryError

        model = segmentation.load({str(TINY_A)!r}, mode="portable", device="cpu", threads=1)
        xs = [np.full((40, 48, 3), i, np.uint8) for i in range(150)]
        model(xs[:8])
        # One batch of 150 needs ~350 MB more than a batch of 4 (measured: 64 images +160 MB).
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + (160 << 20), vm + (160 << 20)))
        results = model(xs)
        assert len(results) == 150 and all(r.labels.shape == (40, 48) for r in results)
        try:
            model(xs, batch_size=150)
            raise SystemExit("one batch of 150 fitted: the limit is too loose to test anything")
        except OutOfMemoryError as e:
            assert "150 image(s)" in str(e) and "smaller batch" in str(e), str(e)
        print("ok")
    """, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_list_results_equal_single_results_for_every_batch_size():
    r = python(f"""
        import numpy as np
        from sapiens_seg import segmentation

        model = segmentation.load({str(TINY_A)!r}, mode="portable", device="cpu", threads=1,
                                  batch_size=3)
        assert model.batch_size == 3
        rng = np.random.default_rng(0)
        xs = [(rng.random((int(rng.integers(32, 90)), int(rng.integers(32, 90)), 3)) * 255)
              .astype(np.uint8) for _ in range(7)]
        singles = [model(x).labels.copy() for x in xs]
        for size in (None, 1, 2, 7, 50):
            got = model(xs, batch_size=size)
            assert len(got) == 7
            assert all(np.array_equal(g.labels, s) for g, s in zip(got, singles)), size
        for bad in (0, -1, 1.5, True):
            try:
                model(xs, batch_size=bad)
                raise SystemExit(f"batch_size={{bad!r}} accepted")
            except (TypeError, ValueError) as e:
                assert "batch_size" in str(e)
        print("ok")
    """)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("n", [8, 64])
def test_peak_memory_of_a_list_does_not_grow_with_its_length(n, request):
    # Peak RSS of model(list of n) in a fresh process; 64 images must cost about what 8 cost
    # (the results themselves are 40x48 labels: nothing). Measured: +6 MB in batches of 4;
    # +163 MB as one batch (before).
    code = f"""
        import resource
        import numpy as np
        from sapiens_seg import segmentation

        model = segmentation.load({str(TINY_A)!r}, mode="portable", device="cpu", threads=1)
        model(np.zeros((40, 48, 3), np.uint8))
        model([np.full((40, 48, 3), i, np.uint8) for i in range({n})])
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """
    r = python(code)
    assert r.returncode == 0, r.stderr
    peaks = request.config.cache.get("sapiens_seg/list_peak", {})
    peaks[str(n)] = int(r.stdout.split()[-1]) / 1024
    request.config.cache.set("sapiens_seg/list_peak", peaks)
    if n == 64 and "8" in peaks:
        growth = peaks["64"] - peaks["8"]
        assert growth < 40, f"peak RSS 8 images {peaks['8']:.0f} MB, 64 images {peaks['64']:.0f} MB"


# ---- paths that are not UTF-8 -----------------------------------------------------------------

def test_non_utf8_file_names_are_written_losslessly_into_json(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "plain.png", 40, 50)
    weird = os.path.join(os.fsencode(d), b"caf\xe9.png")
    ok, buf = cv2.imencode(".png", np.full((40, 50, 3), 90, np.uint8))
    with open(weird, "wb") as f:
        f.write(buf.tobytes())
    with open(os.path.join(os.fsencode(d), b"bad\xff.png"), "wb") as f:
        f.write(b"not a png")
    for flags in (["--json"], []):
        out = tmp_path / f"out{len(flags)}"
        r = cli("segment", os.fsencode(d), "-o", out, "--model", TINY_A, *flags)
        assert r.returncode == 17, r.stderr.decode(errors="replace")  # the corrupt one
        summary = summary_of(out)  # strict UTF-8 JSON
        by_name = {os.path.basename(bytes.fromhex(e["input_hex"]) if "input_hex" in e
                                    else os.fsencode(e["input"])): e for e in summary["images"]}
        assert set(by_name) == {b"plain.png", b"caf\xe9.png", b"bad\xff.png"}
        cafe = by_name[b"caf\xe9.png"]
        assert cafe["status"] == "ok" and cafe["input"].endswith("caf\\xE9.png")
        assert bytes.fromhex(cafe["input_hex"]) == weird
        labels = bytes.fromhex(cafe["outputs"]["labels_png_hex"])
        assert os.path.basename(labels) == b"caf\xe9_seg.png" and os.path.exists(labels)
        assert "input_hex" not in by_name[b"plain.png"]
        assert by_name[b"bad\xff.png"]["error"] == "invalid_input"
        if flags:
            lines = [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]
            assert sorted(e["status"] for e in lines) == ["error", "ok", "ok"]


# ---- --skip-existing, flags, Ctrl-C ---------------------------------------------------------

def test_skip_existing_merges_the_previous_summary(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for i in range(3):
        write_png(d / f"a{i}.png", 40, 40 + i)
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 30)
    out = tmp_path / "out"
    r = cli("segment", d, "-o", out, "--model", TINY_A)
    assert r.returncode == 17
    first = {e["input"]: e for e in summary_of(out)["images"]}
    assert len(first) == 4
    for i in range(2):
        write_png(d / f"b{i}.png", 48, 40 + i)
    r = cli("segment", d, "-o", out, "--model", TINY_A, "--skip-existing")
    assert r.returncode == 17
    second = summary_of(out)["images"]
    by_input = {e["input"]: e for e in second}
    assert len(second) == len(by_input) == 6, [e["input"] for e in second]
    for i in range(3):  # kept from the first run, as they were
        key = str(d / f"a{i}.png")
        assert by_input[key] == first[key]
    for i in range(2):
        assert by_input[str(d / f"b{i}.png")]["status"] == "ok"
    assert by_input[str(d / "broken.png")]["status"] == "error"  # retried, failed again
    # A corrupt previous summary is replaced, with a warning, not a failure.
    (out / "summary.json").write_text("{ not json")
    r = cli("segment", d, "-o", out, "--model", TINY_A, "--skip-existing")
    assert r.returncode == 17 and b"cannot be read" in r.stderr
    statuses = sorted(e["status"] for e in summary_of(out)["images"])
    assert statuses == ["error"] + ["skipped"] * 5


def test_global_flags_are_accepted_after_the_subcommand(tmp_path):
    # Before: "The following argument was not expected: -v" (exit 2).
    write_png(tmp_path / "x.png", 40, 40)
    r = cli("segment", tmp_path / "x.png", "-o", tmp_path / "o", "--model", TINY_A, "-v")
    assert r.returncode == 0, r.stderr
    assert b"loaded" in r.stderr  # the info log -v asks for
    assert cli("models", "list", "--quiet").returncode == 0
    r = cli("info", "--bogus")
    assert r.returncode == 2 and b"--bogus" in r.stderr


# ---- images: bombs, phone photos, truncation ------------------------------------------------

def test_a_png_bomb_is_refused_before_decoding(tmp_path):
    # 30000x30000 in ~2.6 MB: refused from its header in milliseconds, with no memory to speak
    # of. Before: 3.2 GB of RSS and ~10 s before the refusal.
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(real_png_bomb(30000))
    r = python(f"""
        import resource, time
        from sapiens_seg import segmentation, InvalidInputError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        try:
            segmentation.read_image({str(bomb)!r})
            raise SystemExit("decoded")
        except InvalidInputError as e:
            message = str(e)
        seconds = time.perf_counter() - t0
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(seconds, grew / 1024, message)
    """)
    assert r.returncode == 0, r.stderr
    seconds, grew_mb, message = r.stdout.split(" ", 2)
    assert "30000x30000" in message and "268 megapixels" in message
    assert float(seconds) < 0.5 and float(grew_mb) < 50, r.stdout


def test_phone_photos_with_trailing_data_decode_like_cv2(tmp_path):
    from PIL import Image

    rgb = np.zeros((300, 200, 3), np.uint8)
    rgb[:, :, 0] = np.arange(200, dtype=np.uint8)[None, :]
    rgb[100:200, 50:150] = (200, 30, 90)
    plain = tmp_path / "plain.jpg"
    Image.fromarray(rgb).save(plain, quality=90)
    jpg = plain.read_bytes()
    want = cv2.imread(str(plain))[:, :, ::-1]
    rng = np.random.default_rng(1)
    mp4 = b"\0\0\0\x18ftypmp42\0\0\0\0isommp42"
    cases = {"motion_8k.jpg": jpg + mp4 + rng.bytes(8 << 10),
             "motion_2m.jpg": jpg + mp4 + rng.bytes(2 << 20),
             "ffd9_after.jpg": jpg + b"\xff\xd9" * 1000 + rng.bytes(5000)}
    code_lines = ["import numpy as np", "from sapiens_seg import segmentation"]
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        assert np.array_equal(cv2.imread(str(tmp_path / name))[:, :, ::-1], want)  # cv2 reads it
        code_lines.append(f"np.save({str(tmp_path / name)!r} + '.npy', "
                          f"segmentation.read_image({str(tmp_path / name)!r}))")
    r = python("\n".join(code_lines))
    assert r.returncode == 0, r.stderr
    for name in cases:
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), want), name
    # And through the CLI: the motion photo segments like the plain JPEG.
    out = tmp_path / "out"
    r = cli("segment", plain, tmp_path / "motion_2m.jpg", "-o", out, "--model", TINY_A,
            "--save", "npy")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(out / "plain_seg.npy"), np.load(out / "motion_2m_seg.npy"))


def test_truncated_jpegs_are_refused_wherever_they_are_cut(tmp_path):
    from PIL import Image

    rgb = (np.random.default_rng(2).random((240, 320, 3)) * 255).astype(np.uint8)
    for progressive in (False, True):
        path = tmp_path / f"full_{progressive}.jpg"
        Image.fromarray(rgb).save(path, quality=85, progressive=progressive)
        data = path.read_bytes()
        sos = data.index(b"\xff\xda")
        for k, fraction in enumerate((0.2, 0.5, 0.8, 0.97)):
            cut = data[:max(sos + 30, int(len(data) * fraction))]
            (tmp_path / f"cut{k}_{progressive}.jpg").write_bytes(cut)
        (tmp_path / f"no_eoi_{progressive}.jpg").write_bytes(data[:-2])
        # Cut short, then a comment-like tail holding FFD9: an end marker search is fooled.
        (tmp_path / f"fooled_{progressive}.jpg").write_bytes(
            data[:len(data) // 2] + b"\xff\xfe\x00\x04\xff\xd9" + b"\xff\xd9")
    out = tmp_path / "out"
    r = cli("segment", *sorted(tmp_path.glob("cut*.jpg")), *sorted(tmp_path.glob("no_eoi*")),
            "-o", out, "--model", TINY_A, "--json")
    lines = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert r.returncode == 17 and len(lines) == 10
    for e in lines:
        assert e["status"] == "error" and "truncated JPEG" in e["message"], e
    r = cli("segment", *sorted(tmp_path.glob("fooled*")), "-o", out, "--model", TINY_A, "--json")
    for e in (json.loads(line) for line in r.stdout.decode().splitlines()):
        assert e["status"] == "error", e
