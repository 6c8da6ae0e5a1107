"""One worker-loop iteration, phase by phase, grouped by batch size: where the host's time goes per step.

Why: at full batch the service's loop period runs over the step's GPU time (0.60 s over a run against 0.18 s
for the offline engine, H100, 2026-11-27), while the worker's phase totals (bench/worker_phases.py)
are sums over the whole run, mixing the full batch with the tail and the intake. With async scheduling the
device waits for the host once one iteration's host work (everything but the wait for the tokens) outruns the
step launched in it; this table says which part of that work grows with the batch.

A cycle is one `_iteration` call that ran an engine step; its group is the size of the step whose tokens it
read (the one launched by the iteration before: async scheduling), which at full batch is the size of its own.
"""

from __future__ import annotations

import time

from bench.step_periods import BATCH_EDGES

# Columns of the table, each a phase's mean ms per iteration: (key, header). Nested phases ("of which") follow
# the phase that holds them; "after the step" is _step minus engine.step.
COLUMNS = (
    ("_iteration", "iteration"),
    ("gpu", "GPU of the step"),
    ("engine_host", "engine.step host (not blocked)"),
    ("runner_host", "of it, runner launch"),
    ("_read_during_step", "of it, reads sent"),  # trees before 2026-11-27 13:00 sent them during the step
    ("blocked", "blocked on the GPU"),
    ("after_step", "after the step"),
    ("events_for_outputs", "of it, events"),
    ("publisher.submit", "of it, to the publisher"),
    ("_finish_step_reads", "of it, replies"),
    ("step_reads.receive", "of them, off the socket"),
    ("_send_reads_for_step", "of it, the step's reads sent (before engine.step)"),
    ("before_step", "before the step (admit, drops)"),
)


class LoopCycles:
    """Collects per-iteration phase times (the caller's timers add to the open cycle) and sums them by group."""

    def __init__(self, edges: tuple[int, ...] = BATCH_EDGES) -> None:
        self.edges = edges
        self._open: dict[str, float] | None = None
        self._num_seqs: int | None = None
        self._sums: dict[int, dict[str, float]] = {}
        self._counts: dict[int, int] = {}
        self._records_seen = 0  # the step timer's records already added

    def begin(self) -> None:
        self._open, self._num_seqs = {}, None

    def add(self, name: str, seconds: float) -> None:
        if self._open is not None:
            self._open[name] = self._open.get(name, 0.0) + seconds

    def add_step_records(self, records: list) -> None:
        """The step timer's records (engine/step_timer.py) finished since the last call, to the open cycle: those
        of the step whose tokens the iteration read."""
        for record in records[self._records_seen :]:
            self.add("runner_host", record.host_s)
            self.add("blocked", record.wait_s)
            self.add("gpu", record.gpu_ms / 1e3)
            self._num_seqs = record.num_seqs
        self._records_seen = len(records)

    def end(self) -> None:
        cycle, self._open = self._open, None
        if cycle is None or self._num_seqs is None or "engine.step" not in cycle:
            return  # an idle iteration, or one whose step read no tokens (the run's first)
        group = next((i for i, upper in enumerate(self.edges) if self._num_seqs < upper), None)
        if group is None:
            return
        cycle["engine_host"] = cycle["engine.step"] - cycle.get("blocked", 0.0)
        if "_step" in cycle:  # a worker's loop
            cycle["after_step"] = cycle["_step"] - cycle["engine.step"]
            cycle["before_step"] = cycle["_iteration"] - cycle["_step"]
        sums = self._sums.setdefault(group, {})
        for name, seconds in cycle.items():
            sums[name] = sums.get(name, 0.0) + seconds
        self._counts[group] = self._counts.get(group, 0) + 1

    def clear(self) -> None:
        """A new window; the caller clears the step timer's records with it."""
        self._open, self._sums, self._counts, self._records_seen = None, {}, {}, 0

    def summary(self) -> list[dict]:
        """Per group with iterations: its sequence range, the count and each column's mean ms."""
        rows = []
        for group in sorted(self._counts):
            lower = 0 if group == 0 else self.edges[group - 1]
            count = self._counts[group]
            means = {key: self._sums[group].get(key, 0.0) * 1e3 / count for key, _ in COLUMNS}
            rows.append({"seqs": f"{lower}-{self.edges[group] - 1}", "iterations": count, "mean_ms": means})
        return rows


# The offline engine's loop is engine.step and nothing else: its columns.
ENGINE_COLUMNS = ("_iteration", "gpu", "engine_host", "runner_host", "blocked")


def time_engine_steps(engine, timer, cycles: LoopCycles):
    """Times an engine driven without a worker (the offline path): each engine.step call opens a cycle that the
    next call closes, so its iteration is the period between two calls' starts. Returns the untimed step, to
    put back."""
    step = engine.step
    cycles.add_step_records(timer.records)  # no cycle open: the records before this run are skipped
    last_started: list[float] = []

    def timed(*args, **kwargs):
        started = time.perf_counter()
        if last_started:
            cycles.add("_iteration", started - last_started.pop())
            cycles.end()
        last_started.append(started)
        cycles.begin()
        try:
            return step(*args, **kwargs)
        finally:
            cycles.add("engine.step", time.perf_counter() - started)
            cycles.add_step_records(timer.records)

    engine.step = timed
    return step


def cycles_markdown(rows: list[dict], label: str = "Service worker", keys: tuple[str, ...] | None = None) -> list[str]:
    if not rows:
        return []
    columns = [(key, header) for key, header in COLUMNS if keys is None or key in keys]
    lines = [
        f"{label}: one loop iteration by batch size, mean ms per iteration (bench/loop_cycles.py; 'of it' "
        "phases lie inside the one before; GPU is the device time of the step read in the iteration)",
        "",
        "| sequences | iterations | " + " | ".join(header for _, header in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = " | ".join(f"{row['mean_ms'][key]:.2f}" for key, _ in columns)
        lines.append(f"| {row['seqs']} | {row['iterations']} | {cells} |")
    return lines + [""]
