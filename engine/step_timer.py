"""Opt-in timings of each ModelRunner step, for benchmarks: host time spent staging and
launching, host time blocked on the device, and device time (CUDA events).

Off by default (the runner's `timer` is None): a step then pays nothing for it.

NOTE: with async scheduling two steps are in flight at once (step k+1 is launched before
step k's tokens are read), so each step carries its own clock from `begin` to `finish`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class StepTiming:
    """One step.

    Args:
        host_s: host time from the start of the runner's launch until every kernel of the step
            is launched (staging, copies, graph replay or eager forward, sampling launches).
        wait_s: host time blocked waiting for the device to read the step's tokens (its one sync).
        gpu_ms: device time from the forward's launch (the batch already staged) to the last
            sampling kernel (0 on CPU).
        num_seqs, num_tokens: the step's size; graphed: whether it ran padded to a graph bucket (a CUDA
            graph's replay; in an enforce_eager engine, or with capture off, that bucket's eager forward).
        context_tokens: sum of the step's sequence lengths (cached + new tokens).
        started_s: time.perf_counter() when the runner began the step (benchmarks lay steps on a timeline).
    """

    host_s: float
    wait_s: float
    gpu_ms: float
    num_seqs: int
    num_tokens: int
    graphed: bool
    context_tokens: int
    started_s: float


class StepClock:
    """One step's marks: `launching` once its batch is staged, `launched` once its last kernel is queued."""

    def __init__(self, device: torch.device) -> None:
        self._t0 = time.perf_counter()
        self._t1 = self._t0
        self._cuda = device.type == "cuda"
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def launching(self) -> None:
        if self._cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()

    def launched(self) -> None:
        if self._events is not None:
            self._events[1].record()
        self._t1 = time.perf_counter()


@dataclass
class StepTimer:
    """Collects StepTiming records: the runner calls `begin` when it starts a step and `finish`
    once the step's tokens are read."""

    device: torch.device
    records: list[StepTiming] = field(default_factory=list)

    def begin(self) -> StepClock:
        return StepClock(self.device)

    def finish(
        self, clock: StepClock, wait_s: float, num_seqs: int, num_tokens: int, graphed: bool, context_tokens: int
    ) -> None:
        gpu_ms = 0.0
        if clock._events is not None:
            clock._events[1].synchronize()  # done after the step's sync; a step that samples nothing waits here
            gpu_ms = clock._events[0].elapsed_time(clock._events[1])
        self.records.append(
            StepTiming(clock._t1 - clock._t0, wait_s, gpu_ms, num_seqs, num_tokens, graphed, context_tokens, clock._t0)
        )
