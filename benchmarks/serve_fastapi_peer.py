"""The Python server a user would write around the binding, for serve_bench.py's peer column:
FastAPI on uvicorn (one process), ``POST /v1/segment`` with the image's bytes answered with the
label PNG (the CLI's bytes, through the binding's encoder), ``GET /ready``.

It is built like the C++ server, so the comparison is of the serving machinery and not of the
scheme: each request's image is prepared on a thread of Starlette's pool (``Model.prepare``, the
GIL released), and one asyncio task takes up to ``--max-batch`` prepared images that arrived
within ``--max-delay-ms`` of the first and runs them as one ``Model.run`` on its own thread
(``--max-batch 1``: no batching, still one network call at a time). No limits, metrics or
other outputs: a benchmark peer, not a product.

    .venv/bin/python benchmarks/serve_fastapi_peer.py --model build/fixtures/tiny_b_torchscript.pt2 \\
        --port 8001 --max-batch 4 --max-delay-ms 5 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from sapiens_seg import _core, segmentation
from sapiens_seg.errors import SapiensSegError


def make_app(model: segmentation.Model, max_batch: int, max_delay_ms: float) -> FastAPI:
    queue: asyncio.Queue = asyncio.Queue()
    network = ThreadPoolExecutor(1)

    async def batcher() -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            deadline = time.monotonic() + max_delay_ms / 1000.0
            while len(batch) < max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), left))
                except asyncio.TimeoutError:
                    break
            batch = [(p, f) for p, f in batch if not f.cancelled()]
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(network, model.run, [p for p, _ in batch])
                for (_, f), r in zip(batch, results):
                    if not f.done():
                        f.set_result(r)
            except Exception as e:  # noqa: BLE001 - every waiting request gets the error
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        task = asyncio.create_task(batcher())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/ready")
    async def ready() -> dict:
        return {"status": "ready"}

    @app.post("/v1/segment")
    async def segment(request: Request) -> Response:
        body = await request.body()
        try:
            prepared = await run_in_threadpool(model.prepare, body)
            future = asyncio.get_running_loop().create_future()
            await queue.put((prepared, future))
            result = await future
            png = await run_in_threadpool(_core.encode_labels_png, result.labels)
        except SapiensSegError as e:
            return JSONResponse({"error": {"code": e.code.label, "message": str(e)}},
                                status_code=422 if e.code.label == "invalid_input" else 500)
        return Response(png, media_type="image/png")

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--max-batch", type=int, default=segmentation.DEFAULT_BATCH_SIZE)
    p.add_argument("--max-delay-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dtype", default=None)
    p.add_argument("--input-height", type=int, default=0)
    p.add_argument("--input-width", type=int, default=0)
    args = p.parse_args()
    model = segmentation.load(args.model, device="cpu", threads=args.threads, dtype=args.dtype,
                              accept_noncommercial=True, input_height=args.input_height,
                              input_width=args.input_width)
    uvicorn.run(make_app(model, args.max_batch, args.max_delay_ms), host=args.host,
                port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
