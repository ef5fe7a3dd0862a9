"""The Ray Serve deployment: one replica holds the models; each request's image is prepared on
a thread of the replica (``Model.prepare``: decode, resize, normalise, GIL released) and the
prepared images that arrive together run as one network batch (``@serve.batch`` around
``Model.run``)."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import serve
from starlette.responses import Response

from .. import segmentation
from ..errors import ErrorCode
from . import _contract, _encode
from ._contract import HTTPError
from ._metrics import Metrics

if TYPE_CHECKING:
    from collections.abc import Sequence

    from starlette.requests import Request

# Defaults shared with `python -m sapiens_seg.serve` and build_app (docs/serve.md).
DEFAULT_MAX_DELAY_MS = 5.0
DEFAULT_MAX_QUEUE = 32
DEFAULT_MAX_BODY_BYTES = 32 << 20
DEFAULT_MAX_PIXELS = 40_000_000
DEFAULT_PREPARE_THREADS = 4

_ENDPOINTS = ("/health", "/ready", "/metrics", "/v1/models", "/v1/segment")
_PROBES = ("/", "/health", "/ready", "/metrics")  # no API key needed


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(doc).encode(), status_code=status, headers=headers,
                    media_type="application/json")


def _error(e: HTTPError) -> Response:
    return Response(e.body(), status_code=e.status, headers=e.headers,
                    media_type="application/json")


class SapiensSegServer:
    """One replica of the deployment (see :func:`sapiens_seg.serve.build_app`).

    Args:
        models: card ids or checkpoint paths (readable on every node); the first is the
            default of requests that name none. Each is served under its ``ModelInfo.id``.
        max_batch: most requests in one network call (1: no batching).
        max_delay_ms: how long the first request of a batch waits for others.
        max_queue: most segment requests a replica admits and has not yet put in a batch
            (being prepared or waiting); the next one gets 503 with ``Retry-After``.
        max_body_bytes, max_pixels: a larger body, or an image whose header says it has more
            pixels, gets 413.
        api_key_file: a file holding the key (trailing whitespace dropped) that segment and
            models requests must carry (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``);
            probes are exempt.
        prepare_threads: threads of the replica that prepare images (and encode answers).
        **options: the library's options by name (``segmentation.load``'s keywords: ``mode``,
            ``dtype``, ``accept_noncommercial``, ...). ``device`` left unset is the GPU Ray
            assigned to the replica, else the CPU; ``threads`` left unset is the replica's CPUs.
    """

    def __init__(self, models: Sequence[str], *, max_batch: int = segmentation.DEFAULT_BATCH_SIZE,
                 max_delay_ms: float = DEFAULT_MAX_DELAY_MS, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_pixels: int = DEFAULT_MAX_PIXELS, api_key_file: str | None = None,
                 prepare_threads: int = DEFAULT_PREPARE_THREADS, **options: Any) -> None:
        from ..ray._segmenter import _actor_device, _assigned_cpus

        if isinstance(models, (str, os.PathLike)):
            models = [os.fspath(models)]
        options = dict(options)
        options.pop("batch_size", None)  # a run option: max_batch is the network batch here
        if not options.get("device"):
            options["device"] = _actor_device()
        if not options.get("threads"):
            options["threads"] = _assigned_cpus()
        self._models: dict[str, segmentation.Model] = {}
        for m in models:
            model = segmentation.load(m, **options)
            self._models.setdefault(model.info.id, model)
        self._default = next(iter(self._models))
        self._max_batch = int(max_batch)
        self._max_delay_ms = float(max_delay_ms)
        self._max_queue = int(max_queue)
        self._max_body = int(max_body_bytes)
        self._max_pixels = int(max_pixels)
        self._api_key = None
        if api_key_file:
            self._api_key = Path(api_key_file).read_bytes().rstrip()
            if not self._api_key:
                raise ValueError(f"api_key_file {api_key_file}: the file is empty")
        self._held = 0  # queue slots: segment requests admitted and not yet in a batch
        self._in_flight = 0  # segment requests admitted and not yet answered
        self._workers = ThreadPoolExecutor(max(1, int(prepare_threads)),
                                           thread_name_prefix="sapiens-prepare")
        self._network = ThreadPoolExecutor(1, thread_name_prefix="sapiens-run")
        self._metrics = Metrics(list(self._models), _replica_name())
        self._run_batch.set_max_batch_size(self._max_batch)
        self._run_batch.set_batch_wait_timeout_s(self._max_delay_ms / 1000.0)

    # ---- routing ----

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        endpoint = path if path in _ENDPOINTS else "other"
        try:
            response = await self._route(request, path)
        except HTTPError as e:
            response = _error(e)
        except Exception as e:  # noqa: BLE001 - a bug: still a JSON answer, never Ray's text
            response = _error(_contract.from_library_error(e))
        self._metrics.request(endpoint, response.status_code)
        return response

    async def _route(self, request: Request, path: str) -> Response:
        want = "POST" if path == "/v1/segment" else "GET"
        if path in _ENDPOINTS and request.method != want and not (
                want == "GET" and request.method == "HEAD"):
            raise HTTPError(405, ErrorCode.INVALID_INPUT.label,
                            f"{path} takes {want}, not {request.method}", {"Allow": want})
        if path not in _PROBES:
            self._authorize(request)
        if path == "/health":
            return _json({"status": "ok"})
        if path == "/ready":
            return _json({"status": "ready"})
        if path == "/metrics":
            return Response(self._metrics.text(self._in_flight),
                            media_type="text/plain; version=0.0.4")
        if path == "/v1/models":
            return _json({"models": [self._describe(m) for m in self._models.values()]})
        if path == "/v1/segment":
            return await self._segment(request)
        raise HTTPError(404, ErrorCode.NOT_FOUND.label, f"no endpoint {path}")

    def _authorize(self, request: Request) -> None:
        if self._api_key is None:
            return
        given = request.headers.get("x-api-key", "")
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        if not hmac.compare_digest(given.encode(), self._api_key):
            self._metrics.reject("unauthorized")
            raise HTTPError(401, ErrorCode.INVALID_INPUT.label, "missing or wrong API key",
                            {"WWW-Authenticate": "Bearer"})

    def _describe(self, model: segmentation.Model) -> dict[str, Any]:
        i = model.info
        return {"id": i.id, "family": i.family, "classes": list(i.classes),
                "palette": [list(c) for c in i.palette], "input_size": list(i.input_size),
                "device": i.backend.device, "dtype": i.backend.dtype, "mode": i.backend.mode,
                "max_batch": self._max_batch, "max_delay_ms": self._max_delay_ms,
                "max_queue": self._max_queue}

    # ---- POST /v1/segment ----

    async def _segment(self, request: Request) -> Response:
        body = await self._read_body(request)
        ask = _contract.parse_query(request.query_params)
        image = _contract.image_of(request.headers.get("content-type"), body, ask)
        model_id = ask.model or self._default
        model = self._models.get(model_id)
        if model is None:
            raise HTTPError(404, ErrorCode.NOT_FOUND.label,
                            f"no model {model_id!r} (loaded: {', '.join(self._models)})")
        try:
            classes = _encode.parse_classes(ask.classes, model.info.classes)
        except ValueError as e:  # InvalidInputError: an unknown class
            raise _contract.bad_request(str(e)) from None
        self._check_header(image)
        if self._held >= self._max_queue:
            self._metrics.reject("queue_full")
            raise _contract.unavailable(f"the queue of this replica is full ({self._max_queue} "
                                        "requests); retry later")
        # A queue slot from admission (before decoding) until the request's batch starts, as
        # the C++ server counts them: max_queue bounds the decoded images a replica holds.
        self._held += 1
        self._in_flight += 1
        self._metrics.queued(model_id, 1)
        started = [False]  # set by the batch that takes the request, which frees its slot
        loop = asyncio.get_running_loop()
        try:
            try:
                prepared = await loop.run_in_executor(self._workers, model.prepare, image)
            except Exception as e:  # noqa: BLE001 - the library's error, answered as JSON
                raise _contract.from_library_error(e) from None
            result, queue_ms = await self._run_batch(model_id, prepared, time.perf_counter(),
                                                     started)
            if isinstance(result, BaseException):
                raise _contract.from_library_error(result)
            timings = dict(result.timings)
            timings["queue"] = queue_ms
            body, headers = await loop.run_in_executor(
                self._workers, lambda: _encode.encode(ask.output, result, model.info,
                                                      classes=classes, rle=ask.rle,
                                                      opacity=ask.opacity, timings=timings))
        finally:
            self._in_flight -= 1
            if not started[0]:
                self._held -= 1
                self._metrics.queued(model_id, -1)
        return Response(body, headers=headers)

    async def _read_body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise _contract.bad_request(f"bad Content-Length {length!r}")
            if int(length) > self._max_body:
                self._metrics.reject("too_large")
                raise _contract.bad_request(
                    f"the body ({length} bytes) is over the limit of {self._max_body}", 413)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self._max_body:
                self._metrics.reject("too_large")
                raise _contract.bad_request(f"the body is over the limit of {self._max_body} "
                                            "bytes", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    def _check_header(self, image: bytes) -> None:
        """What the image's header says, before any decoding: not an image (415), a malformed
        header or a side under 32 pixels (400), more pixels than allowed (413)."""
        try:
            header = _encode.image_header(image)
        except ValueError as e:  # InvalidInputError: a malformed header
            raise _contract.bad_request(str(e)) from None
        if header is None:  # this binding cannot read headers: prepare() decides
            return
        fmt, height, width = header
        if not fmt:
            self._metrics.reject("unsupported_media_type")
            raise HTTPError(415, ErrorCode.INVALID_INPUT.label,
                            "the body is not an image the server decodes (JPEG, PNG, WebP, "
                            "TIFF, BMP, PNM)")
        if height * width > self._max_pixels:
            self._metrics.reject("too_large")
            raise _contract.bad_request(
                f"the image is {width}x{height} = {width * height} pixels; this server takes "
                f"at most {self._max_pixels} (max_pixels)", 413)
        if width < 32 or height < 32:
            raise _contract.bad_request(
                f"the image is {width}x{height}; both sides must be at least 32")

    @serve.batch(max_batch_size=segmentation.DEFAULT_BATCH_SIZE,
                 batch_wait_timeout_s=DEFAULT_MAX_DELAY_MS / 1000.0)
    async def _run_batch(self, model_ids: list[str], prepared: list[Any], since: list[float],
                         started: list[list[bool]]) -> list[tuple[Any, float]]:
        """The network calls for what arrived together: one ``Model.run`` per model in it. A
        batch that fails (out of memory, ...) is run again one image at a time, so each request
        gets its own answer."""
        start = time.perf_counter()
        out: list[tuple[Any, float]] = [(None, (start - t) * 1000.0) for t in since]
        for model_id, flag in zip(model_ids, started):
            flag[0] = True
            self._held -= 1
            self._metrics.queued(model_id, -1)
        loop = asyncio.get_running_loop()
        for model_id in dict.fromkeys(model_ids):
            idx = [i for i, m in enumerate(model_ids) if m == model_id]
            model = self._models[model_id]
            self._metrics.batch(model_id, len(idx), [out[i][1] / 1000.0 for i in idx])
            t0 = time.perf_counter()
            try:
                results = await loop.run_in_executor(
                    self._network, model.run, [prepared[i] for i in idx])
            except Exception:  # noqa: BLE001 - again one at a time, each with its own answer
                results = []
                for i in idx:
                    try:
                        results.append((await loop.run_in_executor(
                            self._network, model.run, [prepared[i]]))[0])
                    except Exception as e:  # noqa: BLE001
                        results.append(e)
            self._metrics.inference(time.perf_counter() - t0)
            for i, r in zip(idx, results):
                out[i] = (r, out[i][1])
        return out


def _replica_name() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a replica (a unit test)
        return ""

