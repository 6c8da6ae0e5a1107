"""Where a benchmarked worker's wall time goes: wall-clock totals of the loop's phases and of the
engine's steps (with the runner's StepTimer: GPU busy time, host time before the sync, time
blocked on the device), between two signals from the benchmark.

SIGUSR1 starts a window (resets the totals), SIGUSR2 writes the window's totals as JSON. Used by
bench/service_overhead.py's worker child only; the worker itself carries no timing code.
"""

from __future__ import annotations

import gc
import json
import signal
import time
from pathlib import Path

# Worker methods timed (each call's wall time, summed); _iteration holds all the others. _finish_step_reads runs
# inside _step, after engine.step; the reads' send inside _step too (_send_reads_for_step, before engine.step,
# since 2026-11-27), or inside engine.step while the GPU works (_read_during_step, earlier trees: the service
# A/B runs this file against them). A name the worker lacks is skipped.
LOOP_PHASES = ("_iteration", "_intake", "_admit_if_due", "_read_during_step", "_send_reads_for_step",
               "_finish_step_reads", "_check_cancels", "_drop_late", "_drop_lost", "_step")  # fmt: skip


class WorkerPhases:
    def __init__(self, worker, result_path: Path) -> None:
        from bench.loop_cycles import LoopCycles
        from engine.step_timer import StepTimer

        self.worker, self.result_path = worker, result_path
        self.totals: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        for name in (name for name in LOOP_PHASES if hasattr(worker, name)):
            setattr(worker, name, self._timed(name, getattr(worker, name)))
        # Reading into the window and admitting it: the Worker's MessageIntake (earlier trees: the Worker itself)
        intake = worker.intake if hasattr(worker.intake, "window") else None
        owner, receive = (intake, "receive") if intake is not None else (worker, "_receive")
        setattr(owner, receive, self._first_call("first_read_at", getattr(owner, receive)))
        owner._admit = self._intake_clock(self._first_call("first_admit_at", owner._admit))
        worker.engine.step = self._timed("engine.step", worker.engine.step)
        # Inside _step's after-step work: building the events and handing them to the publisher (the pipe's
        # send waits when the publisher process falls behind)
        from worker import loop as loop_module

        worker.publisher.submit = self._timed("publisher.submit", worker.publisher.submit)
        # Inside _finish_step_reads: the replies' wait alone (the rest parses new messages and resolves cancels).
        # Runs of 2026-11-27 saw 0.28-0.50 s a run in _finish_step_reads on H100 hosts without knowing the wait's share.
        # Below the timer: Redis's clock on each send's replies (bench/step_reads_clock.py)
        from bench.step_reads_clock import StepReadsClock

        replies = intake.replies if intake is not None else worker.step_reads
        self.reads_clock = StepReadsClock(replies)
        replies.receive = self._timed("step_reads.receive", replies.receive)
        loop_module.events_for_outputs = self._timed("events_for_outputs", loop_module.events_for_outputs)
        worker.engine.runner.timer = self.timer = StepTimer(worker.engine.device)
        self.cycles = LoopCycles()
        from bench.kernel_variants import VariantLog

        self.variants = VariantLog().install()
        self.started = time.perf_counter()
        self.first_step_at: float | None = None
        self.last_step_at: float | None = None
        self.marks: dict[str, float] = {}
        # (when Redis took the message, when the worker admitted it) for every message admitted, both on
        # perf_counter's clock: how fast a burst comes in through the API against how fast the worker takes it
        self.intake: list[tuple[float, float]] = []
        # The garbage collector's pauses, per generation (any thread's; all stop the loop's Python).
        self.gc_s = [0.0, 0.0, 0.0]
        self.gc_count = [0, 0, 0]
        self._gc_started: float | None = None
        gc.callbacks.append(self._on_gc)
        signal.signal(signal.SIGUSR1, lambda signum, frame: self.reset())
        signal.signal(signal.SIGUSR2, lambda signum, frame: self.write())

    def _timed(self, name: str, fn):
        engine = self.worker.engine

        def timed(*args, **kwargs):
            # an intake while the engine has nothing to run is waiting for work, not overhead
            key = name if name != "_intake" or engine.has_unfinished_requests() else "_intake_idle"
            if name == "_iteration":
                self.cycles.begin()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.totals[key] = self.totals.get(key, 0.0) + end - start
                self.calls[key] = self.calls.get(key, 0) + 1
                self.cycles.add(key, end - start)
                if name == "_iteration":
                    self.cycles.end()
                elif name == "engine.step":  # the engine's busy span, on the clients' clock (CLOCK_MONOTONIC)
                    self.cycles.add_step_records(self.timer.records)
                    self.first_step_at = start if self.first_step_at is None else self.first_step_at
                    self.last_step_at = end

        return timed

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            generation = info["generation"]
            self.gc_s[generation] += time.perf_counter() - self._gc_started
            self.gc_count[generation] += 1
            self._gc_started = None

    def _first_call(self, mark: str, fn):
        """Records when fn first ran with a non-empty first argument (messages read, admitted) in the window."""

        def marked(*args, **kwargs):
            if self.marks.get(mark) is None and args and len(args[0]):
                self.marks[mark] = time.perf_counter()
            return fn(*args, **kwargs)

        return marked

    def _intake_clock(self, admit):
        """Records each message admitted: its stream id's milliseconds (Redis's wall clock, on this host)
        moved onto perf_counter's clock, and the admission's moment."""

        def timed_admit(deliveries, *args, **kwargs):
            now = time.perf_counter()
            wall_minus_perf = time.time() - now
            for delivery in deliveries:
                in_redis = int(delivery.message_id.split("-", 1)[0]) / 1000 - wall_minus_perf
                self.intake.append((in_redis, now))
            return admit(deliveries, *args, **kwargs)

        return timed_admit

    def reset(self) -> None:
        self.variants.clear()
        self.totals.clear()
        self.calls.clear()
        self.timer.records.clear()
        self.cycles.clear()
        self.reads_clock.clear()
        self.started = time.perf_counter()
        self.first_step_at = self.last_step_at = None
        self.marks.clear()
        self.intake.clear()
        self.gc_s, self.gc_count = [0.0, 0.0, 0.0], [0, 0, 0]

    def summary(self) -> dict:
        from bench.step_periods import first_steps, period_by_batch

        records = self.timer.records
        step_s = self.totals.get("engine.step", 0.0)
        runner_host = sum(r.host_s for r in records)
        blocked = sum(r.wait_s for r in records)
        return {
            "window_s": time.perf_counter() - self.started,
            "first_read_at": self.marks.get("first_read_at"),
            "first_admit_at": self.marks.get("first_admit_at"),
            "first_step_at": self.first_step_at,
            "last_step_at": self.last_step_at,
            "phases_s": dict(self.totals),
            "calls": dict(self.calls),
            "steps": len(records),
            "gpu_busy_s": sum(r.gpu_ms for r in records) / 1000,
            "runner_host_s": runner_host,
            "blocked_s": blocked,
            # engine.step minus the runner: scheduler, detokenizer, outputs
            "engine_host_s": step_s - runner_host - blocked,
            "gc_s": list(self.gc_s),
            "gc_count": list(self.gc_count),
            "gc_threshold": list(gc.get_threshold()),
            "mean_decode_batch": (
                sum(r.num_seqs for r in records if r.graphed) / max(1, sum(1 for r in records if r.graphed))
            ),
            "period_by_batch": period_by_batch(records),
            "first_steps": first_steps(records),
            "loop_cycles": self.cycles.summary(),
            "kernel_variants": self.variants.summary(),
            "step_reads_clock": self.reads_clock.summary(),
            "intake": [list(pair) for pair in self.intake],
        }

    def write(self) -> None:
        self.result_path.write_text(json.dumps(self.summary(), indent=1))
