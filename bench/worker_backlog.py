"""The worker's event backlog during a benchmark phase: a thread scrapes the worker's /metrics every
`interval_s` for inferq_worker_unwritten_event_batches (steps' result events not yet written to Redis) and
keeps its peak and mean. A backlog delays every client's tokens, whatever the engine's speed, so a phase whose
TTFT grows while this stays near 0 waits elsewhere (the request stream, the engine's queue, the API).
The same scrape keeps the engine's running and waiting requests (their means): a phase that runs below the
offline engine's rate with fewer running than its slots was not kept full by what feeds it.

    with WorkerBacklog(port) as backlog:
        ...  # the phase
    backlog.figures()  # {"peak": ..., "mean": ..., "samples": ..., "running_mean": ..., "waiting_mean": ...}
"""

from __future__ import annotations

import re
import threading
import urllib.request

METRIC = "inferq_worker_unwritten_event_batches"
ENGINE_METRICS = {"running": "inferq_worker_running_requests", "waiting": "inferq_worker_waiting_requests"}


def _pattern(metric: str) -> re.Pattern:
    return re.compile(rf"^{metric} ([0-9.eE+-]+)$", re.M)


_SAMPLE = _pattern(METRIC)
_ENGINE_SAMPLES = {name: _pattern(metric) for name, metric in ENGINE_METRICS.items()}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class WorkerBacklog:
    def __init__(self, port: int, interval_s: float = 0.1) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval_s = interval_s
        self.values: list[float] = []
        self.engine_values: dict[str, list[float]] = {name: [] for name in ENGINE_METRICS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="worker-backlog", daemon=True)

    def __enter__(self) -> WorkerBacklog:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                text = urllib.request.urlopen(self.url, timeout=1).read().decode()
            except OSError:
                continue  # a scrape that fails is a sample missing, not a zero
            match = _SAMPLE.search(text)
            if match:
                self.values.append(float(match.group(1)))
            for name, pattern in _ENGINE_SAMPLES.items():
                match = pattern.search(text)
                if match:
                    self.engine_values[name].append(float(match.group(1)))

    def figures(self) -> dict:
        values = self.values
        return {"peak": max(values, default=None), "mean": _mean(values), "samples": len(values),
                **{f"{name}_mean": _mean(v) for name, v in self.engine_values.items()}}  # fmt: skip
