"""The request side of the serving contract (docs/serve.md), without Ray: what a request asks
for (query, JSON overrides), where its image is (raw body, multipart, base64 JSON), and the JSON
errors with the library's error codes and the HTTP statuses the C++ server answers with."""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header

from ..errors import ErrorCode, SapiensSegError

if TYPE_CHECKING:
    from collections.abc import Mapping

OUTPUTS = ("png", "json", "npy", "overlay")
"""The values of ``output``; the first is the default."""

DEFAULT_OPACITY = 0.5


class HTTPError(Exception):
    """A request answered with an error: ``status``, the library's error code label, a message
    and extra headers (``Retry-After``)."""

    def __init__(self, status: int, code: str, message: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        return error_body(self.code, self.message)


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def bad_request(message: str, status: int = 400) -> HTTPError:
    return HTTPError(status, ErrorCode.INVALID_INPUT.label, message)


def from_library_error(e: BaseException) -> HTTPError:
    """The answer to an exception raised by the library for an image that passed the header
    checks, as the C++ server gives it: bad input is 422 (a well-formed header over data that
    cannot be decoded), out of memory and an unavailable backend are 503, anything else is a
    bug (500)."""
    if isinstance(e, SapiensSegError):
        code = e.code
    elif isinstance(e, MemoryError):
        code = ErrorCode.OUT_OF_MEMORY
    else:
        code = ErrorCode.INTERNAL
    status = {ErrorCode.INVALID_INPUT: 422, ErrorCode.OUT_OF_MEMORY: 503,
              ErrorCode.BACKEND_UNAVAILABLE: 503}.get(code, 500)
    return HTTPError(status, code.label, str(e) or type(e).__name__,
                     {"Retry-After": "1"} if status == 503 else None)


def unavailable(message: str) -> HTTPError:
    """503 with Retry-After: a full queue (the C++ server's answer and code)."""
    return HTTPError(503, ErrorCode.BACKEND_UNAVAILABLE.label, message, {"Retry-After": "1"})


@dataclass
class Ask:
    """What one POST /v1/segment asks for."""

    model: str | None = None
    output: str = OUTPUTS[0]
    classes: Any = None   # None, or what the client sent (resolved against the model later)
    rle: bool = False
    opacity: float = DEFAULT_OPACITY


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "false", "0"):
        return value.lower() in ("true", "1")
    raise bad_request(f"{name}: expected true or false, got {value!r}")


def _opacity(value: Any) -> float:
    if isinstance(value, bool):
        raise bad_request(f"opacity: expected a number in [0, 1], got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise bad_request(f"opacity: expected a number in [0, 1], got {value!r}") from None
    if math.isnan(v) or not 0.0 <= v <= 1.0:
        raise bad_request(f"opacity: must be in [0, 1], got {value!r}")
    return v


def _apply(ask: Ask, values: Mapping[str, Any], typed: bool = False) -> None:
    """Sets what ``values`` holds: the query's strings, or (``typed``) a JSON body's values,
    where ``rle`` is a JSON boolean and ``opacity`` a JSON number."""
    if typed:
        if "rle" in values and not isinstance(values["rle"], bool):
            raise bad_request('"rle" must be true or false')
        if "opacity" in values and (isinstance(values["opacity"], bool)
                                    or not isinstance(values["opacity"], (int, float))):
            raise bad_request('"opacity" must be a number in [0, 1]')
        if "classes" in values and not isinstance(values["classes"], (str, list)):
            raise bad_request('"classes" must be a string or a list')
    if "model" in values:
        if not isinstance(values["model"], str) or not values["model"]:
            raise bad_request(f"model: expected a model id, got {values['model']!r}")
        ask.model = values["model"]
    if "output" in values:
        if values["output"] not in OUTPUTS:
            raise bad_request(f"output: expected one of {', '.join(OUTPUTS)}, got "
                              f"{values['output']!r}")
        ask.output = values["output"]
    if "classes" in values:
        ask.classes = values["classes"]
    if "rle" in values:
        ask.rle = _bool(values["rle"], "rle")
    if "opacity" in values:
        ask.opacity = _opacity(values["opacity"])


def parse_query(params: Mapping[str, str]) -> Ask:
    """The query parameters of POST /v1/segment (unknown ones are ignored)."""
    ask = Ask()
    _apply(ask, {k: params[k] for k in ("model", "output", "classes", "rle", "opacity")
                 if k in params})
    return ask


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def image_of(content_type: str | None, body: bytes, ask: Ask) -> bytes:
    """The encoded image a request's body carries, by its Content-Type; a JSON body's fields
    override the query (``ask`` is updated)."""
    kind = media_type(content_type)
    # No Content-Type at all is taken as octet-stream (RFC 9110 allows it), as the C++ server does.
    if not kind or kind.startswith("image/") or kind == "application/octet-stream":
        image = body
    elif kind == "multipart/form-data":
        image = _multipart_image(content_type or "", body)
    elif kind == "application/json":
        image = _json_image(body, ask)
    else:
        raise HTTPError(415, ErrorCode.INVALID_INPUT.label,
                        f"unsupported Content-Type {kind or '(none)'!r}: send the image's bytes "
                        "(image/*), multipart/form-data with an 'image' part, or JSON with "
                        "base64 'image'")
    if not image:
        raise bad_request("the request carries no image (empty body)")
    return image


def _multipart_image(content_type: str, body: bytes) -> bytes:
    """The one part named ``image`` (RFC 7578), read by python-multipart (Starlette's parser)."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary", b"")
    if not boundary or len(boundary) > 70:
        raise bad_request("multipart/form-data: no valid boundary parameter")
    parts: list[tuple[bytes, list[bytes]]] = []  # (Content-Disposition, data pieces)
    header: dict[str, bytes] = {}

    def on_part_begin() -> None:
        parts.append((b"", []))
        header.clear()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header["field"] = header.get("field", b"") + data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header["value"] = header.get("value", b"") + data[start:end]

    def on_header_end() -> None:
        if header.get("field", b"").strip().lower() == b"content-disposition":
            parts[-1] = (header.get("value", b""), parts[-1][1])
        header.clear()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][1].append(data[start:end])

    ended = []
    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field,
        "on_header_value": on_header_value, "on_header_end": on_header_end,
        "on_part_data": on_part_data, "on_end": lambda: ended.append(True)})
    try:
        parser.write(body)
        parser.finalize()
    except MultipartParseError as e:
        raise bad_request(f"multipart/form-data: {e}") from None
    if not ended:
        raise bad_request("multipart/form-data: the body ends before its closing boundary")
    images = [b"".join(data) for disposition, data in parts
              if parse_options_header(disposition)[1].get(b"name") == b"image"]
    if not images:
        raise bad_request("multipart/form-data: no part named image")
    if len(images) > 1:
        raise bad_request("multipart/form-data: more than one part named image")
    return images[0]


def _json_image(body: bytes, ask: Ask) -> bytes:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"JSON body: {e}") from None
    if not isinstance(doc, dict):
        raise bad_request("JSON body: expected an object with 'image' (base64)")
    image = doc.get("image")
    if not isinstance(image, str):
        raise bad_request("JSON body: 'image' must be the base64 of the encoded image")
    # Whitespace is skipped and the closing padding may be left out, as the C++ server reads it.
    text = "".join(image.split())
    if len(text) % 4 == 1:
        raise bad_request('"image" is not valid base64')
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"JSON body: 'image' is not valid base64 ({e})") from None
    _apply(ask, doc, typed=True)
    return data
