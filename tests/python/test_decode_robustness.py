"""Real runs lose nothing (library half): EXIF orientation as the pinned opencv-python wheel
applies it, Pillow images of every mode by the documented rule, decoder warnings surfaced,
non-regular files refused at once, Ctrl-C in a long list call, and a checkpoint rewritten while
a loaded model (Python and CLI) uses it.

    SAPIENS_SEG_BUILD=$PWD/build SAPIENS_SEG_FIXTURES=$PWD/build/fixtures \\
        .venv/bin/python -m pytest -q tests/python/test_decode_robustness.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import BUILD, CLI, FIXTURES, PKG_PARENT, use_built_package

TINY_A = FIXTURES / "tiny_a_torchscript.pt2"
S2_TINY = FIXTURES / "s2_tiny.safetensors"

use_built_package()

import cv2  # noqa: E402
from PIL import Image  # noqa: E402

from sapiens_seg import DecodeWarning, InvalidInputError, segmentation  # noqa: E402

needs_fixtures = pytest.mark.skipif(not TINY_A.exists(), reason=f"no fixtures in {FIXTURES}")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the caller's SAPIENS_SEG_/HF_ settings; the library's state
    (hash stamps of checkpoints without a card) goes to the test home, not the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    env["SAPIENS_SEG_HOME"] = os.environ.get("SAPIENS_SEG_HOME", str(BUILD / "test-home"))
    env.update(extra)
    return env


def picture(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A non-symmetric RGB picture (a quarter turn or a flip changes it)."""
    rng = np.random.default_rng(seed)
    img = (rng.random((h, w, 3)) * 60).astype(np.uint8)
    img += np.linspace(0, 180, w, dtype=np.uint8)[None, :, None]
    img[: h // 3, : w // 4] = (250, 20, 20)
    return img


def with_orientation(rgb: np.ndarray, path: Path, fmt: str, orientation: int) -> None:
    im = Image.fromarray(rgb)
    exif = im.getexif()
    exif[0x0112] = orientation
    kw = {"JPEG": {"quality": 95}, "WEBP": {"lossless": True}}.get(fmt, {})
    im.save(path, fmt, exif=exif, **kw)


# ---- EXIF orientation ----------------------------------------------------------------------

@pytest.mark.parametrize("fmt,ext", [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")])
def test_exif_orientation_is_applied_as_the_wheel_applies_it(tmp_path, fmt, ext):
    """Every orientation of the formats whose EXIF orientation cv2.imread of the pinned wheel
    applies (JPEG APP1, PNG eXIf, WebP EXIF): the same pixels as cv2.imread. WebP orientation
    was ignored before."""
    rgb = picture(40, 64)
    for o in range(1, 9):
        p = tmp_path / f"o{o}.{ext}"
        with_orientation(rgb, p, fmt, o)
        want = cv2.imread(str(p))[:, :, ::-1]
        got = segmentation.read_image(p)
        assert got.shape == want.shape, (fmt, o)
        assert np.array_equal(got, want), (fmt, o)
        # Pillow agrees on the geometry (exif_transpose of the same file).
        from PIL import ImageOps
        ref = np.asarray(ImageOps.exif_transpose(Image.open(p)).convert("RGB"))
        assert ref.shape == got.shape, (fmt, o)


def test_tiff_orientation_follows_libtiff_like_the_wheel(tmp_path):
    """TIFF orientation is libtiff's business, as in the wheel: 1-4 give cv2.imread's pixels;
    5-8 (a quarter turn), which cv2.imread of the wheel fails to read at all, give Pillow's
    exif_transpose."""
    from PIL import ImageOps
    rgb = picture(40, 64)
    for o in range(1, 9):
        p = tmp_path / f"o{o}.tif"
        with_orientation(rgb, p, "TIFF", o)
        got = segmentation.read_image(p)
        if o <= 4:
            assert np.array_equal(got, cv2.imread(str(p))[:, :, ::-1]), o
        ref = np.asarray(ImageOps.exif_transpose(Image.open(p)).convert("RGB"))
        assert np.array_equal(got, ref), o


# ---- Pillow modes --------------------------------------------------------------------------

def _grey3(v: np.ndarray) -> np.ndarray:
    return np.repeat(v[:, :, None], 3, axis=2)


@needs_fixtures
def test_pillow_images_of_every_mode_follow_the_documented_rule(tmp_path):
    """16-bit samples keep their high byte (as cv2.imread reduces a 16-bit PNG), whatever Pillow
    mode holds them; other modes go through convert("RGB"). I;16 was binarised to 0/255."""
    model = segmentation.load(TINY_A, mode="portable")
    h, w = 40, 48
    ramp16 = (np.arange(h * w, dtype=np.uint32).reshape(h, w) * 37 % 65536).astype(np.uint16)
    high = (ramp16 >> 8).astype(np.uint8)
    cases = {
        "I;16": (Image.fromarray(ramp16), _grey3(high)),
        "I;16B": (Image.frombytes("I;16B", (w, h), ramp16.astype(">u2").tobytes()), _grey3(high)),
        "I": (Image.fromarray(ramp16.astype(np.int32)), _grey3(high)),
        "F": (Image.fromarray(ramp16.astype(np.float32)), _grey3(high)),
    }
    # Out-of-range 32-bit values clip to 0..65535 first.
    wide = np.full((h, w), 70000, np.int32)
    wide[:, : w // 2] = -5
    clipped = np.where(wide > 0, 255, 0).astype(np.uint8)
    cases["I clipped"] = (Image.fromarray(wide), _grey3(clipped))
    rgb = picture(h, w)
    rgba = np.dstack([rgb, np.full((h, w), 7, np.uint8)])
    for mode in ("L", "1", "LA", "P", "PA", "RGBA", "CMYK", "YCbCr"):
        im = Image.fromarray(rgba, "RGBA") if mode in ("LA", "PA", "RGBA") else Image.fromarray(rgb)
        im = im.convert(mode)
        cases[mode] = (im, np.asarray(im.convert("RGB")))
    for name, (im, want) in cases.items():
        r = model(im)
        assert r.overlay(0.0).shape == want.shape, name
        assert np.array_equal(r.overlay(0.0), want), name
    # The 16-bit PNG file (decoded as cv2.imread decodes it) and the same samples as a PIL image
    # give the same pixels.
    png16 = tmp_path / "ramp16.png"
    assert cv2.imwrite(str(png16), ramp16)
    assert np.array_equal(model(png16).overlay(0.0), model(cases["I;16"][0]).overlay(0.0))


# ---- decoder warnings ----------------------------------------------------------------------

def _stray_jpeg(tmp_path: Path) -> Path:
    ok, enc = cv2.imencode(".jpg", picture(64, 80)[:, :, ::-1])
    b = enc.tobytes()
    at = b.index(b"\xff\xc4")
    p = tmp_path / "stray.jpg"
    p.write_bytes(b[:at] + b"\x11\x22\x33" + b[at:])
    return p


@needs_fixtures
def test_decoder_warnings_are_surfaced_in_python(tmp_path):
    """A JPEG libjpeg decodes with a warning (cv2.imread accepts it and prints the warning):
    the pixels are cv2's, and the warning is a DecodeWarning / Result.warnings."""
    p = _stray_jpeg(tmp_path)
    text = "libjpeg: Corrupt JPEG data: 3 extraneous bytes before marker 0xc4"
    with pytest.warns(DecodeWarning, match="3 extraneous bytes"):
        got = segmentation.read_image(p)
    assert np.array_equal(got, cv2.imread(str(p))[:, :, ::-1])
    model = segmentation.load(TINY_A, mode="portable")
    assert model(p).warnings == [text]
    assert model(p.read_bytes()).warnings == [text]
    clean = tmp_path / "clean.png"
    cv2.imwrite(str(clean), picture(40, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        segmentation.read_image(clean)
    assert model(clean).warnings == []


@needs_fixtures
def test_decoder_warnings_reach_the_cli_json(tmp_path):
    p = _stray_jpeg(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run([str(CLI), "segment", str(p), "--model", str(TINY_A), "-o", str(out),
                        "--json"], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    text = json.dumps(summary)
    assert "3 extraneous bytes before marker 0xc4" in text
    # The library's log line (libjpeg itself also prints the bare message to stderr).
    assert (f"sapiens-seg warning: {p}: libjpeg: Corrupt JPEG data: 3 extraneous bytes before "
            "marker 0xc4") in r.stderr


# ---- non-regular files ---------------------------------------------------------------------

def _in_subprocess(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A fresh interpreter with this build's package: a call that hangs fails by the timeout
    instead of hanging the suite."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=clean_env(PYTHONPATH=str(PKG_PARENT)), timeout=timeout)


@needs_fixtures
def test_fifos_sockets_and_devices_are_refused_at_once(tmp_path):
    """model(path), read_image(path) and load(path) on a FIFO hung (open() waits for a writer);
    now each is an InvalidInputError that says what the path is."""
    fifo_jpg, fifo_pt2 = tmp_path / "in.jpg", tmp_path / "m.pt2"
    os.mkfifo(fifo_jpg)
    os.mkfifo(fifo_pt2)
    sock_path = tmp_path / "s.png"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_path))
    try:
        r = _in_subprocess(f"""
            import time
            from sapiens_seg import segmentation, InvalidInputError
            def refused(fn, *words):
                t0 = time.monotonic()
                try:
                    fn()
                except InvalidInputError as e:
                    assert all(w in str(e) for w in words), str(e)
                    assert time.monotonic() - t0 < 5
                    return
                raise AssertionError("accepted")
            m = segmentation.load({str(TINY_A)!r}, mode="portable")
            refused(lambda: m({str(fifo_jpg)!r}), "in.jpg", "FIFO")
            refused(lambda: segmentation.read_image({str(fifo_jpg)!r}), "FIFO")
            refused(lambda: segmentation.load({str(fifo_pt2)!r}), "m.pt2", "FIFO")
            refused(lambda: segmentation.read_image({str(sock_path)!r}), "socket")
            refused(lambda: segmentation.read_image("/dev/zero"), "character device")
            print("ok")
        """, timeout=120)
    finally:
        srv.close()
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# ---- Ctrl-C in a long list call -------------------------------------------------------------

@needs_fixtures
def test_keyboard_interrupt_in_a_long_list_call_is_prompt_and_clean(tmp_path):
    """SIGINT while model([...]) decodes a long list raises KeyboardInterrupt before the next
    image (the GIL is released for the work; the binding runs Python's handler between images),
    returns nothing partial, and leaves the model usable. Before, the interrupt waited for the
    whole list's native call."""
    src = tmp_path / "big.png"
    cv2.imwrite(str(src), cv2.resize(picture(150, 200), (2000, 1500)),
                [cv2.IMWRITE_PNG_COMPRESSION, 9])
    code = f"""
        import os, signal, sys, threading, time
        from sapiens_seg import segmentation
        m = segmentation.load({str(TINY_A)!r}, mode="portable")
        paths = [{str(src)!r}] * 60
        t0 = time.monotonic(); m(paths, batch_size=len(paths)); full = time.monotonic() - t0
        sent = []
        def interrupt():
            time.sleep(min(0.5, full / 4))
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt).start()
        out = None
        try:
            out = m(paths, batch_size=len(paths))
        except KeyboardInterrupt:
            lag = time.monotonic() - sent[0]
            assert out is None
            r = m({str(src)!r})
            assert r.labels.shape == (1500, 2000)
            print(f"interrupted lag={{lag:.3f}} full={{full:.3f}}")
            sys.exit(0)
        print(f"not interrupted full={{full:.3f}}")
        sys.exit(1)
    """
    r = _in_subprocess(code, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    words = dict(kv.split("=") for kv in r.stdout.split()[1:])
    lag, full = float(words["lag"]), float(words["full"])
    assert lag < full / 3, r.stdout


# ---- checkpoints changed underfoot ---------------------------------------------------------

@needs_fixtures
@pytest.mark.parametrize("name", ["tiny_a_torchscript.pt2", "s2_tiny.safetensors"])
def test_python_model_survives_its_checkpoint_being_rewritten(tmp_path, name):
    """`cp new.pt2 model.pt2` while a loaded model is used: in place, then cut short. The model
    keeps the weights it loaded (it died of SIGBUS after a truncation: run in a subprocess)."""
    copy = tmp_path / ("model" + Path(name).suffix)
    shutil.copyfile(FIXTURES / name, copy)
    img = FIXTURES / "images" / "synth_300x211.png"
    r = _in_subprocess(f"""
        import os
        import numpy as np
        from sapiens_seg import segmentation
        m = segmentation.load({str(copy)!r}, mode="portable", logits=True)
        before = m({str(img)!r}).logits.copy()
        size = os.path.getsize({str(copy)!r})
        with open({str(copy)!r}, "r+b") as f:
            f.write(b"\\x7f" * size)
        assert np.array_equal(m({str(img)!r}).logits, before)
        os.truncate({str(copy)!r}, 100)
        assert np.array_equal(m({str(img)!r}).logits, before)
        print("ok")
    """, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stderr[-2000:])


@needs_fixtures
@pytest.mark.parametrize("name", ["tiny_a_torchscript.pt2", "s2_tiny.safetensors"])
def test_cli_run_survives_its_checkpoint_being_cut_short(tmp_path, name):
    """The CLI's model read once: cutting the checkpoint short after the first image is written
    changes nothing for the run (it ended with SIGBUS, exit 135, and no summary)."""
    copy = tmp_path / ("model" + Path(name).suffix)
    shutil.copyfile(FIXTURES / name, copy)
    images = tmp_path / "in"
    images.mkdir()
    src = cv2.resize(picture(150, 200), (800, 600))
    for i in range(3):
        cv2.imwrite(str(images / f"img{i:02d}.png"), np.roll(src, i * 7, axis=1))
    out = tmp_path / "out"
    p = subprocess.Popen([str(CLI), "segment", str(images), "--model", str(copy), "-o", str(out),
                          "--json", "--batch-size", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=clean_env())
    deadline = time.monotonic() + 300
    while not any(out.glob("*_seg.png")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.truncate(copy, 100)
    truncated_while_running = p.poll() is None
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert truncated_while_running, "the run ended before the checkpoint was cut"
    assert len(list(out.glob("*_seg.png"))) == 3, summary
