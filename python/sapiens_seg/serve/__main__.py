"""``python -m sapiens_seg.serve``: the deployment on a local Ray cluster (started for it) or an
existing one (``--address auto``), Serve's HTTP proxy on ``--host``:``--port``; it runs until
interrupted (Ctrl-C or SIGTERM), then shuts Serve down."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from .. import _core
from .._option_flags import add_option_flags
from ..segmentation import OPTION_SPECS
from . import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DELAY_MS, DEFAULT_MAX_PIXELS,
               DEFAULT_MAX_QUEUE, DEFAULT_PREPARE_THREADS, DEFAULT_BATCH_SIZE, build_app)

# In a replica, these options left at their defaults mean the replica's own resources.
_REPLICA_MEANING = {"device": "the GPU Ray assigned to the replica, else the CPU",
                    "threads": "the CPUs Ray assigned to the replica"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sapiens_seg.serve",
        description="Serve Sapiens segmentation over HTTP with Ray Serve, with the contract of "
                    "`sapiens-seg serve` (POST /v1/segment, /health, /ready, /v1/models, "
                    "/metrics).")
    p.add_argument("-m", "--model", action="append", default=None,
                   help="card id or checkpoint path; repeat to serve several (default: "
                        f"{_core.default_model()})")
    p.add_argument("--host", default="127.0.0.1", help="address of Serve's HTTP proxy "
                   "(default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="its port (default: %(default)s)")
    p.add_argument("--address", default=None,
                   help="an existing cluster (auto, HOST:PORT); default: start a local one")
    p.add_argument("--num-cpus", type=int, default=None, help="local cluster: CPUs")
    p.add_argument("--num-gpus", type=int, default=None, help="local cluster: GPUs")
    p.add_argument("--replicas", type=int, default=1, help="replicas (default: %(default)s)")
    p.add_argument("--gpus-per-replica", type=float, default=0.0,
                   help="GPUs reserved per replica (default: %(default)s)")
    p.add_argument("--cpus-per-replica", type=float, default=1.0,
                   help="CPUs reserved per replica (default: %(default)s)")
    p.add_argument("--max-batch", type=int, default=DEFAULT_BATCH_SIZE,
                   help="most images per network call; 1 turns batching off (default: "
                        "%(default)s)")
    p.add_argument("--max-delay-ms", type=float, default=DEFAULT_MAX_DELAY_MS,
                   help="how long a batch's first request waits for more (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help="segment requests one replica holds before answering 503 (default: "
                        "%(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="request body limit (default: %(default)s)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="image pixel limit, read from its header (default: %(default)s)")
    p.add_argument("--api-key-file", default=None,
                   help="require this key (first line of the file) on segment and models "
                        "requests")
    p.add_argument("--prepare-threads", type=int, default=DEFAULT_PREPARE_THREADS,
                   help="threads per replica that decode and resize (default: %(default)s)")
    # The network batch is --max-batch here, so the run options are not flags.
    add_option_flags(p, skip_groups=("run",), meanings=_REPLICA_MEANING)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options: dict[str, Any] = {s["name"]: getattr(args, s["name"]) for s in OPTION_SPECS
                               if s["group"] != "run"}
    app = build_app(args.model, replicas=args.replicas, gpus_per_replica=args.gpus_per_replica,
                    cpus_per_replica=args.cpus_per_replica, max_batch=args.max_batch,
                    max_delay_ms=args.max_delay_ms, max_queue=args.max_queue,
                    max_body_bytes=args.max_body_bytes, max_pixels=args.max_pixels,
                    api_key_file=args.api_key_file, prepare_threads=args.prepare_threads,
                    **options)
    import ray
    from ray import serve

    ray.init(address=args.address, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
             include_dashboard=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name="sapiens-seg", route_prefix="/")
        print(f"sapiens_seg.serve: ready on http://{args.host}:{args.port}/", file=sys.stderr,
              flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
