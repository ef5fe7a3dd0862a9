"""The response bodies of POST /v1/segment: the one place where a result becomes bytes, by the
C++ server's own encoders (src/serve/encode.cpp, bound as ``sapiens_seg._core.serve``), so the
two servers answer the same bytes for the same result."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _core

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..segmentation import ModelInfo, Result

CONTENT_TYPES = {"png": "image/png", "overlay": "image/png", "json": "application/json",
                 "npy": "application/octet-stream"}

_serve = _core.serve


def encode(output: str, result: Result, info: ModelInfo, *, classes: Sequence[int] | None,
           rle: bool, opacity: float, timings: dict[str, float]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a 200 answer for one segmented image (the GIL is released while
    the C++ encoders run)."""
    headers = {"Content-Type": CONTENT_TYPES[output]}
    labels = result.labels
    if output == "png":
        return _serve.labels_png(labels), headers
    if output == "npy":
        headers["Content-Disposition"] = 'attachment; filename="labels.npy"'
        return _serve.labels_npy(labels), headers
    shown = None if classes is None else list(classes)
    if output == "overlay":
        # The photo as the library decoded it (a request's image is always encoded bytes).
        image = result._native.image
        return _serve.overlay_png(labels, image, [list(c) for c in info.palette], opacity,
                                  shown), headers
    b = result.backend
    t = dict(timings)
    queue_ms = t.pop("queue", 0.0)
    return _serve.summary_json(
        labels, model=info.id, class_names=list(info.classes),
        palette=[list(c) for c in info.palette],
        backend={"mode": b.mode, "device": b.device, "dtype": b.dtype}, timings=t,
        queue_ms=queue_ms, warnings=result.warnings, classes=shown, rle=rle), headers


def parse_classes(value: object, names: Sequence[str]) -> list[int] | None:
    """The ``classes`` parameter as the C++ server reads it (a comma list, or a JSON list, of
    names or indices) as sorted indices; ``None`` selects every class. InvalidInputError for an
    unknown item."""
    if value is None:
        return None
    chosen = _serve.parse_classes(value, list(names))
    return chosen or None


def image_header(data: bytes) -> tuple[str, int, int] | None:
    """(format, height, width) from an encoded image's header, before any decoding; format ""
    for bytes that are no image format the library decodes. ``None`` when this binding cannot
    read headers. A malformed header raises InvalidInputError."""
    if not hasattr(_serve, "image_info"):
        return None
    if not _serve.sniff_format(data):
        return "", 0, 0
    fmt, height, width = _serve.image_info(data)
    return fmt, int(height), int(width)
