"""A replica's GET /metrics: the counters, histograms and gauges of the serving contract, in
Prometheus' text format, with the C++ server's names. Each replica counts its own requests (a
scrape through Ray's proxy reaches one replica; label ``replica`` says which)."""

from __future__ import annotations

import bisect
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
        tail = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{tail} {self.sum!r}", f"{name}_count{tail} {running}"]
        return out


class Metrics:
    def __init__(self, models: Sequence[str], replica: str = "") -> None:
        self._models = list(models)
        self._replica = replica
        self._requests: Counter[tuple[str, int]] = Counter()
        self._rejections: Counter[str] = Counter()
        self._queue_wait = _Histogram(_SECONDS)
        self._inference = _Histogram(_SECONDS)
        self._batch_size = _Histogram(_SIZES)
        self._queued = dict.fromkeys(self._models, 0)

    def request(self, endpoint: str, status: int) -> None:
        self._requests[(endpoint, status)] += 1

    def reject(self, reason: str) -> None:
        self._rejections[reason] += 1

    def batch(self, model: str, size: int, waits_s: Sequence[float]) -> None:
        self._batch_size.observe(size)
        for w in waits_s:
            self._queue_wait.observe(w)

    def inference(self, seconds: float) -> None:
        self._inference.observe(seconds)

    def text(self, in_flight: int) -> str:
        rep = f'replica="{self._replica}"' if self._replica else ""
        c = "," if rep else ""
        lines = ["# HELP sapiens_seg_requests_total HTTP requests answered, by endpoint and status",
                 "# TYPE sapiens_seg_requests_total counter"]
        for (endpoint, status), n in sorted(self._requests.items()):
            lines.append(f'sapiens_seg_requests_total{{{rep}{c}endpoint="{endpoint}",'
                         f'status="{status}"}} {n}')
        lines += ["# HELP sapiens_seg_rejections_total requests refused before inference, by "
                  "reason", "# TYPE sapiens_seg_rejections_total counter"]
        for reason, n in sorted(self._rejections.items()):
            lines.append(f'sapiens_seg_rejections_total{{{rep}{c}reason="{reason}"}} {n}')
        for name, hist, what in (
                ("sapiens_seg_queue_wait_seconds", self._queue_wait,
                 "time between an image's preparation and its network call"),
                ("sapiens_seg_inference_seconds", self._inference,
                 "time of one network call (Model.run) for a batch"),
                ("sapiens_seg_batch_size", self._batch_size, "images per network call")):
            lines += [f"# HELP {name} {what}", f"# TYPE {name} histogram"]
            lines += hist.lines(name, rep)
        lines += ["# HELP sapiens_seg_queue_depth requests waiting for a network call",
                  "# TYPE sapiens_seg_queue_depth gauge"]
        for model, n in self._queued.items():
            lines.append(f'sapiens_seg_queue_depth{{{rep}{c}model="{model}"}} {n}')
        lines += ["# HELP sapiens_seg_in_flight_requests segment requests being served",
                  "# TYPE sapiens_seg_in_flight_requests gauge",
                  f"sapiens_seg_in_flight_requests{{{rep}}} {in_flight}" if rep else
                  f"sapiens_seg_in_flight_requests {in_flight}"]
        return "\n".join(lines) + "\n"

    def queued(self, model: str, delta: int) -> None:
        self._queued[model] = self._queued.get(model, 0) + delta
