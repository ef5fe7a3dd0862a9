#!/usr/bin/env python3
"""Writes the seed corpus of the image-input fuzz target (tests/fuzz/corpus_images/): small
real images of every format the library accepts, in the variants cameras and tools produce.

    .venv/bin/python tests/fuzz/make_image_corpus.py [OUT_DIR]

Deterministic (fixed seeds); each file is a few kilobytes. Reproducers of fuzzing findings are
kept in the same folder under names starting with ``regress_``; this script never touches them.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

ORIENTATION = 0x0112


def picture(h: int, w: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = ((x * 255) // max(w - 1, 1) + (y * 128) // max(h - 1, 1)) % 256
    img = np.stack([base, (base * 3) % 256, 255 - base][:channels] +
                   ([rng.integers(0, 256, (h, w))] if channels == 4 else []), axis=-1)
    return img.astype(np.uint8).reshape(h, w, channels) if channels > 1 else \
        base.astype(np.uint8)


def pil_bytes(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[ORIENTATION] = orientation
    return e.tobytes()


def cv_bytes(img: np.ndarray, ext: str, params: list[int] | None = None) -> bytes:
    ok, buf = cv2.imencode(ext, img, params or [])
    assert ok, ext
    return buf.tobytes()


def corpus() -> dict[str, bytes]:
    rgb = Image.fromarray(picture(40, 56))
    grey = Image.fromarray(picture(40, 56, 1))
    rgba = Image.fromarray(picture(40, 56, 4), "RGBA")
    bgr = picture(40, 56)[:, :, ::-1].copy()
    files: dict[str, bytes] = {
        "baseline.jpg": pil_bytes(rgb, "JPEG", quality=80),
        "progressive.jpg": pil_bytes(rgb, "JPEG", quality=80, progressive=True),
        "grey.jpg": pil_bytes(grey, "JPEG", quality=80),
        "subsampling444.jpg": pil_bytes(rgb, "JPEG", quality=90, subsampling=0),
        "cmyk.jpg": pil_bytes(rgb.convert("CMYK"), "JPEG", quality=80),
        "restart.jpg": cv_bytes(bgr, ".jpg", [cv2.IMWRITE_JPEG_RST_INTERVAL, 2]),
        "rgb.png": pil_bytes(rgb, "PNG"),
        "grey.png": pil_bytes(grey, "PNG"),
        "rgba.png": pil_bytes(rgba, "PNG"),
        "palette.png": pil_bytes(rgb.convert("P"), "PNG"),
        "compression9.png": cv_bytes(bgr, ".png", [cv2.IMWRITE_PNG_COMPRESSION, 9]),
        "deep16.png": cv_bytes((picture(40, 56).astype(np.uint16) * 257), ".png"),
        "grey16.png": cv_bytes((picture(40, 56, 1).astype(np.uint16) * 257), ".png"),
        "lossy.webp": pil_bytes(rgb, "WEBP", quality=70),
        "lossless.webp": pil_bytes(rgb, "WEBP", lossless=True),
        "alpha.webp": pil_bytes(rgba, "WEBP", quality=70),
        "rgb.tiff": pil_bytes(rgb, "TIFF"),
        "lzw.tiff": pil_bytes(rgb, "TIFF", compression="tiff_lzw"),
        "deflate_grey.tiff": pil_bytes(grey, "TIFF", compression="tiff_adobe_deflate"),
        "deep16.tiff": cv_bytes((picture(40, 56).astype(np.uint16) * 257), ".tiff"),
        "rgba.tiff": pil_bytes(rgba, "TIFF"),
        "rgb.bmp": pil_bytes(rgb, "BMP"),
        "grey.bmp": pil_bytes(grey, "BMP"),
        "palette8.bmp": pil_bytes(rgb.convert("P"), "BMP"),
        "rgb.ppm": pil_bytes(rgb, "PPM"),
        "grey.pgm": pil_bytes(grey, "PPM"),
        "deep16.ppm": cv_bytes((picture(40, 56).astype(np.uint16) * 257), ".ppm"),
    }
    for o in (3, 6, 8):  # 180 degrees, and both quarter turns (which swap the sides)
        files[f"exif{o}.jpg"] = pil_bytes(rgb, "JPEG", quality=80, exif=exif(o))
        files[f"exif{o}.webp"] = pil_bytes(rgb, "WEBP", quality=70, exif=exif(o))
        files[f"exif{o}.png"] = pil_bytes(rgb, "PNG", exif=exif(o))
    files["exif6_progressive.jpg"] = pil_bytes(rgb, "JPEG", progressive=True, exif=exif(6))
    tiff6 = Image.fromarray(picture(40, 56))
    files["orientation6.tiff"] = pil_bytes(tiff6, "TIFF", tiffinfo={274: 6})
    # A phone's "motion photo": a JPEG followed by a video.
    files["motion.jpg"] = files["baseline.jpg"] + b"\0\0\0\x18ftypmp42" + bytes(range(256)) * 4
    return files


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "corpus_images"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in corpus().items():
        assert len(data) < 65536, name  # the fuzz run's -max_len
        (out / name).write_bytes(data)
    print(f"{len(corpus())} seed images in {out}")


if __name__ == "__main__":
    main()
