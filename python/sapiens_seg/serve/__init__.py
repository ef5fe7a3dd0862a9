"""Sapiens segmentation as a Ray Serve deployment: ``sapiens_seg.serve``.

The HTTP contract of the C++ server ``sapiens-seg serve`` (docs/serve.md: ``POST /v1/segment``
with the image as raw bytes, multipart or base64 JSON, answered with the label PNG, JSON, npy
or an overlay; ``/health``, ``/ready``, ``/v1/models``, ``/metrics``; JSON errors with the
library's codes), served by as many replicas as the cluster holds. Each replica loads the
models once; a request's image is prepared on a thread of the replica (``Model.prepare``), and
what arrives within ``max_delay_ms`` runs as one network batch of up to ``max_batch`` images
(``@serve.batch`` around ``Model.run``), the GIL released in both::

    import ray
    from ray import serve
    from sapiens_seg.serve import build_app

    ray.init(address="auto")
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build_app(["sapiens-seg-0.3b-goliath"], accept_noncommercial=True, replicas=4,
                        gpus_per_replica=1, max_batch=8), name="sapiens-seg", route_prefix="/")

or ``python -m sapiens_seg.serve --model sapiens-seg-0.3b-goliath --accept-noncommercial``, or
``serve run sapiens_seg.serve:app_builder model=... replicas=2`` (:func:`app_builder`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ray import serve

from .. import _core
from ..segmentation import DEFAULT_BATCH_SIZE, OPTION_SPECS
from ._deployment import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DELAY_MS, DEFAULT_MAX_PIXELS,
                          DEFAULT_MAX_QUEUE, DEFAULT_PREPARE_THREADS, SapiensSegServer)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["SapiensSegDeployment", "SapiensSegServer", "app_builder", "build_app"]

SapiensSegDeployment = serve.deployment(name="sapiens-seg")(SapiensSegServer)
"""The Ray Serve deployment of :class:`SapiensSegServer` (``.options(...).bind(models, ...)``);
:func:`build_app` sets its options from the server's."""

_LIBRARY_OPTIONS = {s["name"]: s for s in OPTION_SPECS if s["group"] != "run"}


def build_app(models: Sequence[str] | str | None = None, *, replicas: int = 1,
              gpus_per_replica: float = 0, cpus_per_replica: float = 1,
              max_batch: int = DEFAULT_BATCH_SIZE, max_delay_ms: float = DEFAULT_MAX_DELAY_MS,
              max_queue: int = DEFAULT_MAX_QUEUE, max_queued_requests: int = -1,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS,
              api_key_file: str | None = None, prepare_threads: int = DEFAULT_PREPARE_THREADS,
              **options: Any) -> serve.Application:
    """The application to ``serve.run``: ``replicas`` copies of :class:`SapiensSegServer`.

    Args:
        models: card ids or checkpoint paths (a local path is made absolute; it must be
            readable on every node). ``None``: the library's default model.
        replicas: replicas (each holds its own copy of every model).
        gpus_per_replica, cpus_per_replica: what Ray reserves for each replica; a replica with
            a GPU runs on it (``device`` unset), and uses as many intra-op threads as it has
            CPUs (``threads`` unset).
        max_batch: most images per network call (1: batching off); defaults to the library's
            batch size.
        max_delay_ms: how long the first request of a batch waits for more.
        max_queue: segment requests one replica admits and has not yet put in a batch (being
            prepared or waiting); more get 503 ``backend_unavailable`` with ``Retry-After``.
        max_queued_requests: requests Ray's proxy queues per deployment before answering 503
            itself (-1: no limit); the proxy sends each replica up to ``max_queue`` +
            ``max_batch`` + 8 at once, so the replica's own limit answers first.
        max_body_bytes, max_pixels, api_key_file, prepare_threads: see
            :class:`SapiensSegServer`.
        **options: the library's options by name, as ``segmentation.load`` takes them.
    """
    unknown = sorted(set(options) - set(_LIBRARY_OPTIONS))
    if unknown:
        raise TypeError(f"build_app: unexpected option(s) {', '.join(unknown)} (library options: "
                        f"{', '.join(_LIBRARY_OPTIONS)})")
    if models is None:
        models = [_core.default_model()]
    elif isinstance(models, (str, os.PathLike)):
        models = [os.fspath(models)]
    models = [os.path.abspath(m) if os.path.exists(m) else m for m in map(os.fspath, models)]
    if not models:
        raise ValueError("build_app: no model")
    for name, value in (("replicas", replicas), ("max_batch", max_batch),
                        ("max_queue", max_queue), ("prepare_threads", prepare_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an integer of at least 1, got {value!r}")
    if max_delay_ms < 0:
        raise ValueError(f"max_delay_ms: must be at least 0, got {max_delay_ms}")
    deployment = SapiensSegDeployment.options(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        # The replica answers over-limit requests itself (503 JSON, as the C++ server); Ray's
        # routing must let them reach it, with room for a running batch and probes.
        max_ongoing_requests=max_queue + max_batch + 8,
        max_queued_requests=max_queued_requests,
        backpressure_config={"retry_after_s": 1})
    return deployment.bind(models, max_batch=max_batch, max_delay_ms=max_delay_ms,
                           max_queue=max_queue, max_body_bytes=max_body_bytes,
                           max_pixels=max_pixels, api_key_file=api_key_file,
                           prepare_threads=prepare_threads, **options)


_APP_ARGS = {"replicas": int, "gpus_per_replica": float, "cpus_per_replica": float,
             "max_batch": int, "max_delay_ms": float, "max_queue": int,
             "max_queued_requests": int, "max_body_bytes": int, "max_pixels": int,
             "api_key_file": str, "prepare_threads": int}


def app_builder(args: dict[str, Any]) -> serve.Application:
    """For ``serve run sapiens_seg.serve:app_builder model=ID_OR_PATH [key=value ...]`` and
    Serve config files (``import_path: sapiens_seg.serve:app_builder`` with ``args``): the keys
    of :func:`build_app` and the library's options; ``model`` may be a comma list or a list.
    Values may be strings, as ``serve run`` passes them."""
    args = dict(args)
    models = args.pop("model", args.pop("models", None))
    if isinstance(models, str):
        models = [m for m in models.split(",") if m]
    kwargs: dict[str, Any] = {}
    for key, value in args.items():
        if key in _APP_ARGS:
            kwargs[key] = _APP_ARGS[key](value) if isinstance(value, str) else value
        elif key in _LIBRARY_OPTIONS:
            kwargs[key] = _option_value(_LIBRARY_OPTIONS[key], value)
        else:
            raise TypeError(f"app_builder: unknown argument {key!r}")
    return build_app(models, **kwargs)


def _option_value(spec: dict[str, Any], value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if spec["type"] == "bool":
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{spec['name']}: expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    if spec["type"] == "int":
        return int(value)
    return value
