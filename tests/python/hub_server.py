"""A small stand-in for the Hugging Face Hub's file endpoint, on loopback, for download tests.

URLs look like http://127.0.0.1:PORT/<mode>/<org>/<name>/resolve/<rev>/<file>, so a test picks
the server's behaviour through HF_ENDPOINT=http://127.0.0.1:PORT/<mode>:

    ok       serves the file, honouring Range (206 with Content-Range)
    slow     as ok, but throttled (for concurrent and interrupted downloads)
    drop     the first request for a file is cut off halfway through; later ones are served
    norange  ignores Range and always sends the whole file with 200
    missing  404
    flaky    the first request for a file gets 500; later ones are served
    wrong    same size, one byte changed
    stall    the first request sends a little, then goes silent; later ones are served

Every request is recorded (path, Range and Authorization headers, User-Agent, status, bytes sent)
so tests can check what crossed the wire.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    mode: str
    file: str
    range: str | None
    authorization: str | None
    user_agent: str | None
    status: int = 0
    sent: int = 0


@dataclass
class HubServer:
    files: dict[str, bytes]
    requests: list[Request] = field(default_factory=list)
    slow_chunk: int = 64 * 1024
    slow_delay: float = 0.02

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                hub._serve(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def endpoint(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def gets(self, file: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if file is None or r.file == file]

    def _record(self, req: Request) -> int:
        with self._lock:
            self.requests.append(req)
            return sum(1 for r in self.requests if r.file == req.file and r.mode == req.mode)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        m = re.match(r"^/([a-z]+)/[^/]+/[^/]+/resolve/[^/]+/(.+)$", h.path)
        if not m:
            h.send_error(400)
            return
        mode, name = m.group(1), m.group(2)
        req = Request(mode, name, h.headers.get("Range"), h.headers.get("Authorization"),
                      h.headers.get("User-Agent"))
        nth = self._record(req)
        data = self.files.get(name)
        if data is None or mode == "missing":
            req.status = 404
            h.send_error(404, "Entry not found")
            return
        if mode == "flaky" and nth == 1:
            req.status = 500
            h.send_error(500, "Internal Server Error")
            return
        if mode == "wrong":
            data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
        start = 0
        rng = req.range if mode != "norange" else None
        if rng:
            rm = re.match(r"bytes=(\d+)-$", rng)
            start = int(rm.group(1)) if rm else 0
            if start >= len(data):
                req.status = 416
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.end_headers()
                return
        body = data[start:]
        req.status = 206 if rng else 200
        h.send_response(req.status)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        try:
            if mode == "drop" and nth == 1:
                half = len(body) // 2
                h.wfile.write(body[:half])
                req.sent = half
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            if mode == "stall" and nth == 1:
                h.wfile.write(body[:1000])
                req.sent = 1000
                h.wfile.flush()
                time.sleep(8)  # the client's low-speed timeout gives up long before this
                return
            step = self.slow_chunk if mode == "slow" else 1 << 20
            for i in range(0, len(body), step):
                h.wfile.write(body[i:i + step])
                req.sent += len(body[i:i + step])
                if mode == "slow":
                    h.wfile.flush()
                    time.sleep(self.slow_delay)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (killed or cancelled): that is what some tests do
