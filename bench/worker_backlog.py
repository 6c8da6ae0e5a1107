"""The worker's event backlog during a benchmark phase: a thread scrapes the worker's /metrics every
`interval_s` for inferq_worker_unwritten_event_batches (steps' result events not yet written to Redis) and
keeps its peak and mean. A backlog delays every client's tokens, whatever the engine's speed, so a phase whose
TTFT grows while this stays near 0 waits elsewhere (the request stream, the engine's queue, the API).

    with WorkerBacklog(port) as backlog:
        ...  # the phase
    backlog.figures()  # {"peak": ..., "mean": ..., "samples": ...}
"""

from __future__ import annotations

import re
import threading
import urllib.request

METRIC = "inferq_worker_unwritten_event_batches"
_SAMPLE = re.compile(rf"^{METRIC} ([0-9.eE+-]+)$", re.M)


class WorkerBacklog:
    def __init__(self, port: int, interval_s: float = 0.1) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval_s = interval_s
        self.values: list[float] = []
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

    def figures(self) -> dict:
        values = self.values
        return {"peak": max(values, default=None), "mean": sum(values) / len(values) if values else None,
                "samples": len(values)}  # fmt: skip
