"""The response bodies of POST /v1/segment: the one place where a result becomes bytes."""

from __future__ import annotations

import io
import json
import struct
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..segmentation import ModelInfo, Result

CONTENT_TYPES = {"png": "image/png", "overlay": "image/png", "json": "application/json",
                 "npy": "application/octet-stream"}


def encode(output: str, result: Result, info: ModelInfo, *, classes: Sequence[int] | None,
           rle: bool, opacity: float, timings: dict[str, float]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a 200 answer for one segmented image."""
    headers = {"Content-Type": CONTENT_TYPES[output]}
    if output == "png":
        return _core.encode_labels_png(result.labels), headers
    if output == "npy":
        headers["Content-Disposition"] = 'attachment; filename="labels.npy"'
        return _npy(result.labels), headers
    if output == "overlay":
        return _overlay_png(result, classes, opacity), headers
    return _summary(result, info, classes, rle, timings), headers


def _npy(labels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, labels.astype("<i8"), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def _overlay_png(result: Result, classes: Sequence[int] | None, opacity: float) -> bytes:
    rgb = result.overlay(opacity)
    if classes is not None:
        image = result._native.image if result._image is None else result._image
        keep = ~np.isin(result.labels, np.asarray(classes, np.uint8))
        rgb = rgb.copy()
        rgb[keep] = image[keep]
    return _png_rgb(rgb)


def _png_rgb(rgb: np.ndarray) -> bytes:
    h, w = rgb.shape[:2]
    raw = np.zeros((h, w * 3 + 1), np.uint8)
    raw[:, 1:] = np.ascontiguousarray(rgb).reshape(h, w * 3)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 1)) + chunk(b"IEND", b""))


def _summary(result: Result, info: ModelInfo, classes: Sequence[int] | None, rle: bool,
             timings: dict[str, float]) -> bytes:
    labels = result.labels
    h, w = labels.shape
    counts = np.bincount(labels.ravel(), minlength=info.num_classes)
    wanted = range(info.num_classes) if classes is None else classes
    out: list[dict[str, Any]] = []
    for k in wanted:
        n = int(counts[k])
        if n == 0:
            continue
        mask = labels == k
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        entry: dict[str, Any] = {
            "index": int(k), "name": info.classes[k], "color": list(info.palette[k]),
            "pixels": n, "fraction": n / float(h * w),
            "bbox": [int(cols[0]), int(rows[0]), int(cols[-1] - cols[0] + 1),
                     int(rows[-1] - rows[0] + 1)]}
        if rle:
            entry["rle"] = {"size": [int(h), int(w)], "counts": _coco_rle(mask)}
        out.append(entry)
    b = result.backend
    doc = {"model": info.id, "width": int(w), "height": int(h),
           "backend": {"mode": b.mode, "device": b.device, "dtype": b.dtype},
           "classes": out, "timings_ms": timings, "warnings": result.warnings}
    return json.dumps(doc).encode()


def _coco_rle(mask: np.ndarray) -> str:
    """COCO's compressed RLE string of a mask (column-major runs, first run of zeros)."""
    flat = mask.T.ravel().view(np.uint8)
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate(([0], edges, [flat.size]))
    runs = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        runs.insert(0, 0)
    text = []
    for i, x in enumerate(runs):
        if i > 2:
            x -= runs[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if (c & 0x10) else (x != 0)
            if more:
                c |= 0x20
            text.append(chr(c + 48))
    return "".join(text)


def image_header(data: bytes) -> tuple[str, int, int] | None:
    """(format, height, width) from an encoded image's header, before any decoding; format ""
    for bytes that are no image format the library decodes. ``None`` when this binding cannot
    read headers. A malformed header raises a 400."""
    serve = getattr(_core, "serve", None)
    if serve is None or not hasattr(serve, "image_info"):
        return None
    if not serve.sniff_format(data):
        return "", 0, 0
    try:
        fmt, height, width = serve.image_info(data)
    except ValueError as e:  # InvalidInputError
        from ._contract import bad_request

        raise bad_request(str(e)) from None
    return fmt, int(height), int(width)
