#!/usr/bin/env python3
"""Serving benchmark: the C++ server `sapiens-seg serve` beside a FastAPI/uvicorn server around
the same Python binding (serve_fastapi_peer.py), same client, same machine, one run.

For each model and each batching setting (on: ``--max-batch``/``--max-delay-ms``; off:
``--max-batch 1``), both servers are started side by side on loopback ports and measured at
each concurrency in turn (C++ then peer, alternating which goes first at each step, so a
machine whose load drifts slows both alike): requests/s and p50/p90/p99 latency of ``POST
/v1/segment`` with one 512x512 JPEG, answered with the label PNG. The client is a bounded
Python client: ``c`` threads, each with its own keep-alive connection, sending until the point's
request count is reached (every request has a timeout; a non-200 answer is counted, not
retried). Percentiles are nearest-rank over the point's requests: with fewer than 100
requests, p99 is the slowest.

Then the server's own overhead: with batching off and one client, the p50 latency through
each server minus the p50 of a direct library call (``Model.prepare`` + ``Model.run`` in this
process, the same threads), rounds of the three alternating.

Every point records the CPU time the server used and what the rest of the machine used in the
meantime (all CPU time less this benchmark's processes), so a loaded machine shows in the
result. Both servers' PNG answers are checked to be the same bytes before timing.

    .venv/bin/python benchmarks/serve_bench.py --cli build/bin/sapiens-seg \\
        --model tiny=build/fixtures/tiny_b_torchscript.pt2 \\
        --model full_0.3b=build-bench/fixtures/full_0.3b_torchscript.pt2 \\
        --dtype full_0.3b=bfloat16 --overhead-models tiny --wait-quiet 1800 \\
        --json benchmarks/results/intel-xeon-amx/serve-cpu.json

Results: JSON (machine_facts: CPU vendor, family, model, stepping, flags; versions; the
command), rendered as Markdown by ``--print FILE``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BUILD = Path(os.environ.get("SAPIENS_SEG_BUILD", REPO / "build"))
# This build's package, for the direct calls here and in both servers.
sys.path[:0] = [str(HERE), str(BUILD / "python")]

from machine_facts import machine_facts  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


# ---- processes and CPU accounting -------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process and its reaped children, seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK


def machine_busy_s() -> float:
    """CPU time spent by everything on the machine (not idle, not iowait), seconds."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = [int(x) for x in parts]
    return (sum(v[:8]) - v[3] - v[4]) / CLK


def top_processes(exclude: set[int], n: int = 5) -> list[dict]:
    """The processes that used the most CPU over one second (other than ours)."""
    def snapshot() -> dict[int, tuple[str, float]]:
        out = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) not in exclude:
                try:
                    stat = (d / "stat").read_text()
                    name = stat.split("(", 1)[1].rsplit(")", 1)[0]
                    f = stat.rsplit(")", 1)[1].split()
                    out[int(d.name)] = (name, (int(f[11]) + int(f[12])) / CLK)
                except (OSError, IndexError, ValueError):
                    pass
        return out

    a = snapshot()
    time.sleep(1.0)
    b = snapshot()
    used = [(b[p][1] - a[p][1], b[p][0]) for p in b if p in a]
    return [{"name": name, "cpus": round(cpu, 2)} for cpu, name in sorted(used, reverse=True)[:n]
            if cpu > 0.01]


def busy_cpus(seconds: float = 3.0) -> float:
    """CPUs the whole machine kept busy over ``seconds``."""
    a = machine_busy_s()
    time.sleep(seconds)
    return (machine_busy_s() - a) / seconds


def wait_quiet(limit_s: float, below: float = 0.25) -> dict:
    """Waits (up to ``limit_s``) until the machine's other jobs use under ``below`` CPUs."""
    t0 = time.monotonic()
    used = busy_cpus()
    while used >= below and time.monotonic() - t0 < limit_s:
        print(f"# waiting for a quiet machine: other jobs use {used:.2f} CPUs", file=sys.stderr)
        time.sleep(20)
        used = busy_cpus()
    return {"waited_s": round(time.monotonic() - t0, 1), "busy_cpus": round(used, 2),
            "quiet": used < below}


class Server:
    def __init__(self, kind: str, argv: list[str], port: int, env: dict[str, str]) -> None:
        self.kind, self.argv, self.port = kind, argv, port
        self.started = time.monotonic()
        # The server's log goes to a file: a pipe nobody reads could fill and stall it.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.loaded_s = 0.0

    def wait_ready(self, timeout: float = 900) -> None:
        """Until GET /ready answers 200; ``loaded_s`` is the time since the process started
        (both servers load side by side)."""
        t0 = self.started
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}: "
                                   f"{self.log.read()[-2000:]}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/ready")
                if c.getresponse().status == 200:
                    self.loaded_s = time.monotonic() - t0
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} not ready after {timeout} s")

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- the client -------------------------------------------------------------------------------

def post(conn: http.client.HTTPConnection, image: bytes) -> tuple[int, bytes]:
    conn.request("POST", "/v1/segment", body=image, headers={"Content-Type": "image/jpeg"})
    r = conn.getresponse()
    return r.status, r.read()


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[k - 1]


def load_point(port: int, image: bytes, concurrency: int, requests: int,
               timeout: float) -> dict:
    """``requests`` POSTs from ``concurrency`` threads; latencies in ms."""
    lock = threading.Lock()
    left = [requests]
    latencies: list[float] = []
    statuses: dict[str, int] = {}

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                t0 = time.perf_counter()
                try:
                    status, _ = post(conn, image)
                except (OSError, http.client.HTTPException):
                    status = 0
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
                ms = (time.perf_counter() - t0) * 1000.0
                with lock:
                    statuses[str(status)] = statuses.get(str(status), 0) + 1
                    if status == 200:
                        latencies.append(ms)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"concurrency": concurrency, "requests": requests, "statuses": statuses,
            "wall_s": round(wall, 3), "rps": round(len(lat) / wall, 3) if wall else 0.0,
            "p50_ms": round(percentile(lat, 50), 2), "p90_ms": round(percentile(lat, 90), 2),
            "p99_ms": round(percentile(lat, 99), 2),
            "mean_ms": round(sum(lat) / len(lat), 2) if lat else float("nan")}


# ---- the run ----------------------------------------------------------------------------------

def parse_pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise SystemExit(f"{what}: expected NAME=VALUE, got {v!r}")
        k, _, x = v.partition("=")
        out[k] = x
    return out


def versions(cli: str) -> dict[str, str]:
    out = {}
    r = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=60)
    out["sapiens_seg_cli"] = (r.stdout or r.stderr).strip().splitlines()[0] if r.returncode == 0 \
        else "unknown"
    for mod in ("fastapi", "starlette", "uvicorn", "uvloop", "httptools"):
        try:
            out[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            out[mod] = "not installed"
    return out


def run(args: argparse.Namespace) -> dict:
    from sapiens_seg import segmentation

    print(f"# sapiens_seg from {Path(segmentation.__file__).parent}", file=sys.stderr)
    image = Path(args.image).read_bytes()
    models = parse_pairs(args.model, "--model")
    per_client = {k: int(v) for k, v in parse_pairs(args.requests_per_client, "--requests-per-client").items()}
    minimum = {k: int(v) for k, v in parse_pairs(args.min_requests, "--min-requests").items()}
    dtypes = parse_pairs(args.dtype, "--dtype")
    conc = [int(c) for c in args.concurrency.split(",") if c]  # empty: the overhead only
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPIENS_SEG_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BUILD / "python"),
                                                    env.get("PYTHONPATH", "")) if p)
    ours = {os.getpid()}
    quiet = wait_quiet(args.wait_quiet) if args.wait_quiet else None
    result: dict = {
        "tool": "serve_bench.py",
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "machine": machine_facts(versions(args.cli)),
        "image": {"file": Path(args.image).name, "bytes": len(image)},
        "settings": {"threads": args.threads, "max_batch": args.max_batch, "max_delay_ms": args.max_delay_ms,
                     "concurrency": conc},
        "wait_quiet": quiet,
        "other_processes_at_start": top_processes(ours),
        "models": [],
    }
    print(f"# other processes at start: {result['other_processes_at_start']}", file=sys.stderr)
    t_start = time.monotonic()
    for name, path in models.items():
        dtype = dtypes.get(name)
        entry: dict = {"name": name, "file": Path(path).name, "dtype": dtype or "default",
                       "runs": []}
        settings = [("on", args.max_batch), ("off", 1)] if "on" in args.batching else [("off", 1)]
        settings = [s for s in settings if s[0] in args.batching and conc]
        for batching, max_batch in settings:
            servers = start_pair(path, dtype, max_batch, args, env)
            cpp, peer = servers
            try:
                for s in servers:
                    s.wait_ready()
                    ours.add(s.proc.pid)
                answers = []
                for s in servers:  # warm-up: single requests, then one full batch
                    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=args.timeout)
                    for _ in range(args.warmup):
                        answers.append(post(c, image))
                    c.close()
                    load_point(s.port, image, max_batch, max_batch, args.timeout)
                same = all(a == answers[0] for a in answers) and answers[0][0] == 200
                print(f"# {name} batching {batching}: servers up (cpp {cpp.loaded_s:.1f} s, "
                      f"fastapi {peer.loaded_s:.1f} s), same PNG bytes: {same}", file=sys.stderr)
                run_entry = {"batching": batching, "max_batch": max_batch,
                             "load_s": {"cpp": round(cpp.loaded_s, 2),
                                        "fastapi": round(peer.loaded_s, 2)},
                             "same_png_bytes": same, "points": []}
                for i, c in enumerate(conc):
                    n = max(minimum.get(name, 8), per_client.get(name, 4) * c)
                    order = servers if i % 2 == 0 else servers[::-1]
                    for s in order:
                        busy0, cpu0 = machine_busy_s(), s.cpu_s()
                        own0 = proc_cpu_s(os.getpid())
                        point = load_point(s.port, image, c, n, args.timeout)
                        busy1, cpu1 = machine_busy_s(), s.cpu_s()
                        own1 = proc_cpu_s(os.getpid())
                        wall = point["wall_s"]
                        point["server"] = s.kind
                        point["server_cpus"] = round((cpu1 - cpu0) / wall, 2)
                        point["other_cpus"] = round(max(0.0, (busy1 - busy0) - (cpu1 - cpu0)
                                                        - (own1 - own0)) / wall, 2)
                        run_entry["points"].append(point)
                        print(f"  {name} {batching} c={c:2d} {s.kind:8s} n={n:3d} "
                              f"{point['rps']:7.2f} req/s p50 {point['p50_ms']:9.1f} "
                              f"p99 {point['p99_ms']:9.1f} ms  other {point['other_cpus']} "
                              f"CPUs {point['statuses']}", file=sys.stderr)
                entry["runs"].append(run_entry)
                if batching == "off" and args.overhead_rounds and name in args.overhead_models:
                    entry["overhead"] = overhead(segmentation, path, dtype, image, servers, args)
            finally:
                for s in servers:
                    s.stop()
                    ours.discard(s.proc.pid)
        if args.overhead_input and name in args.overhead_models:
            # The same measurement with a small network input: the network's time (and its
            # noise) shrinks to a few ms, so the servers' own milliseconds show.
            size = tuple(int(v) for v in args.overhead_input.split("x"))
            servers = start_pair(path, dtype, 1, args, env, size)
            try:
                for s in servers:
                    s.wait_ready()
                    ours.add(s.proc.pid)
                    load_point(s.port, image, 1, args.warmup, args.timeout)
                # Repeated: on a shared machine the spread between repeats is the honest error.
                entry["overhead_small_input"] = [
                    {"input_size": list(size),
                     **overhead(segmentation, path, dtype, image, servers, args, size)}
                    for _ in range(args.overhead_repeats)]
            finally:
                for s in servers:
                    s.stop()
                    ours.discard(s.proc.pid)
        result["models"].append(entry)
    result["elapsed_s"] = round(time.monotonic() - t_start, 1)
    result["other_processes_at_end"] = top_processes(ours)
    result["load_average_at_end"] = list(os.getloadavg())
    return result


def start_pair(path: str, dtype: str | None, max_batch: int, args: argparse.Namespace,
               env: dict[str, str], input_size: tuple[int, int] | None = None) -> list[Server]:
    """The C++ server and the FastAPI peer on the same model and settings, loading side by
    side."""
    common = (["--dtype", dtype] if dtype else []) + (
        ["--input-height", str(input_size[0]), "--input-width", str(input_size[1])]
        if input_size else [])
    cpp = Server("cpp", [args.cli, "serve", "--model", path, "--host", "127.0.0.1", "--port",
                         str(port_a := free_port()), "--threads", str(args.threads),
                         "--max-batch", str(max_batch), "--max-delay-ms", str(args.max_delay_ms),
                         "--max-queue", "256", "--accept-noncommercial", *common], port_a, env)
    peer = Server("fastapi", [sys.executable, str(HERE / "serve_fastapi_peer.py"), "--model",
                              path, "--port", str(port_b := free_port()), "--threads",
                              str(args.threads), "--max-batch", str(max_batch),
                              "--max-delay-ms", str(args.max_delay_ms), *common], port_b, env)
    return [cpp, peer]


def overhead(segmentation, path: str, dtype: str | None, image: bytes, servers: list[Server],
             args: argparse.Namespace, input_size: tuple[int, int] | None = None) -> dict:
    """p50 through each server (one client, batching off) minus p50 of prepare + run here."""
    model = segmentation.load(path, device="cpu", threads=args.threads, dtype=dtype,
                              accept_noncommercial=True, input_size=input_size)
    model.run([model.prepare(image)])
    times: dict[str, list[float]] = {"direct": [], **{s.kind: [] for s in servers}}
    ports = {s.kind: s.port for s in servers}
    conns = {k: http.client.HTTPConnection("127.0.0.1", p, timeout=args.timeout)
             for k, p in ports.items()}

    def timed_post(kind: str) -> float:
        # A server may close a keep-alive connection left idle while the others were timed
        # (sapiens-seg serve after --header-timeout): reconnect and time the resent request.
        for attempt in range(2):
            t0 = time.perf_counter()
            try:
                status, _ = post(conns[kind], image)
            except (ConnectionError, http.client.HTTPException):
                if attempt:
                    raise
                conns[kind].close()
                conns[kind] = http.client.HTTPConnection("127.0.0.1", ports[kind],
                                                         timeout=args.timeout)
                continue
            assert status == 200, status
            return (time.perf_counter() - t0) * 1000.0
        raise AssertionError("unreachable")

    for r in range(args.overhead_rounds):
        order = ["direct", *[s.kind for s in servers]]
        if r % 2:
            order = order[::-1]
        for kind in order:
            for _ in range(args.overhead_calls):
                if kind == "direct":
                    t0 = time.perf_counter()
                    model.run([model.prepare(image)])
                    times[kind].append((time.perf_counter() - t0) * 1000.0)
                else:
                    times[kind].append(timed_post(kind))
    for c in conns.values():
        c.close()
    p50 = {k: round(percentile(sorted(v), 50), 2) for k, v in times.items()}
    out = {"calls": len(times["direct"]), "p50_ms": p50,
           "overhead_p50_ms": {s.kind: round(p50[s.kind] - p50["direct"], 2) for s in servers}}
    print(f"  overhead: {out}", file=sys.stderr)
    return out


# ---- rendering --------------------------------------------------------------------------------

def render(result: dict) -> str:
    m = result["machine"]
    cpu = m["cpu"]
    lines = [f"{result['machine']['date'][:10]}, {cpu['name']} (vendor {cpu['vendor']}, family "
             f"{cpu['family']}, model {cpu['model']}, stepping {cpu['stepping']}), "
             f"{m['cores']} cores; {result['settings']['threads']} intra-op threads per server, "
             f"batching on = max batch "
             f"{result['settings']['max_batch']} within {result['settings']['max_delay_ms']} ms; "
             f"{result['elapsed_s'] / 60:.0f} min in all.", ""]
    for entry in result["models"]:
        dtype = entry["dtype"] if entry["dtype"] != "default" else "float32 (the default)"
        lines.append(f"**{entry['name']}** (`{entry['file']}`, {dtype})"
                     + (":" if entry["runs"] else ""))
        if entry["runs"]:
            lines += ["", "requests/s and p50 / p99 latency in ms of C++ `sapiens-seg serve` and "
                      "the FastAPI peer; ratio = C++ req/s over the peer's", "",
                      "| batching | clients | C++ req/s | C++ p50 / p99 | FastAPI req/s | "
                      "FastAPI p50 / p99 | ratio | requests | other CPUs |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for run_entry in entry["runs"]:
            by = {}
            for p in run_entry["points"]:
                by.setdefault(p["concurrency"], {})[p["server"]] = p
            for c, pts in sorted(by.items()):
                a, b = pts.get("cpp"), pts.get("fastapi")
                if not a or not b:
                    continue
                ratio = a["rps"] / b["rps"] if b["rps"] else float("nan")
                lines.append(f"| {run_entry['batching']} | {c} | {a['rps']:.2f} | "
                             f"{a['p50_ms']:.0f} / {a['p99_ms']:.0f} | {b['rps']:.2f} | "
                             f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f} | {ratio:.2f}x | "
                             f"{a['requests']} | {max(a['other_cpus'], b['other_cpus']):.2f} |")
        for key, what in (("overhead", "the model's own input size"),
                          ("overhead_small_input", "network input {}")):
            found = entry.get(key)
            for i, o in enumerate(found if isinstance(found, list) else [found] if found else []):
                what_i = what.format("x".join(map(str, o.get("input_size", []))))
                rep = f", repeat {i + 1}" if isinstance(found, list) and len(found) > 1 else ""
                lines += ["", f"Overhead over a direct call, {what_i}{rep} (p50 of {o['calls']} "
                          f"calls each, one client, batching off): direct "
                          f"{o['p50_ms']['direct']:.1f} ms; C++ server "
                          f"{o['overhead_p50_ms']['cpp']:+.1f} ms; FastAPI peer "
                          f"{o['overhead_p50_ms']['fastapi']:+.1f} ms."]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--print", metavar="FILE", help="render a result file as Markdown and exit")
    p.add_argument("--cli", default=str(BUILD / "bin" / "sapiens-seg"))
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--image", default=str(REPO / "examples" / "astronaut.jpg"),
                   help="the request's image (default: the 512x512 example JPEG)")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--batching", default="on,off")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-delay-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--dtype", action="append", default=[], metavar="NAME=DTYPE",
                   help="a model's dtype in every server and the direct call (default: the "
                        "library's, float32 on the CPU)")
    p.add_argument("--overhead-models", default=None,
                   help="comma list of the models whose overhead is measured (default: the "
                        "first)")
    p.add_argument("--requests-per-client", action="append", default=[], metavar="NAME=N",
                   help="requests per client thread at each point, per model (default 4)")
    p.add_argument("--min-requests", action="append", default=[], metavar="NAME=N",
                   help="fewest requests at a point, per model (default 8)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--overhead-input", default="64x48", metavar="HxW",
                   help="also measure the overhead with this network input size (the servers' "
                        "--input-height/--input-width), where the network takes milliseconds "
                        "(default %(default)s; '' skips it)")
    p.add_argument("--overhead-repeats", type=int, default=3,
                   help="repeats of the small-input overhead measurement (their spread is the "
                        "error on a shared machine)")
    p.add_argument("--overhead-rounds", type=int, default=5)
    p.add_argument("--overhead-calls", type=int, default=4)
    p.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                   help="first wait up to this long for the machine's other jobs to use under "
                        "a quarter of a CPU (what they used is recorded either way)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    p.add_argument("--json", help="write the result here (else stdout)")
    args = p.parse_args()
    if args.print:
        print(render(json.loads(Path(args.print).read_text())))
        return 0
    if not args.model:
        p.error("--model NAME=PATH is required")
    args.overhead_models = (args.overhead_models.split(",") if args.overhead_models
                            else [args.model[0].split("=", 1)[0]])
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    print(render(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
