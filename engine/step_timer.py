"""Opt-in timings of each ModelRunner step, for benchmarks: host time spent staging and
launching, host time blocked on the device, and device time (CUDA events).

Off by default (the runner's `timer` is None): a step then pays nothing for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class StepTiming:
    """One step.

    Args:
        host_s: host time from the start of `execute` until it blocks on the device's result.
        wait_s: host time blocked waiting for the device (the one sync of the step).
        gpu_ms: device time from the forward's launch (the batch already staged) to the last
            sampling kernel (0 on CPU).
        num_seqs, num_tokens: the step's size; graphed: whether a CUDA graph ran it.
        context_tokens: sum of the step's sequence lengths (cached + new tokens).
    """

    host_s: float
    wait_s: float
    gpu_ms: float
    num_seqs: int
    num_tokens: int
    graphed: bool
    context_tokens: int


@dataclass
class StepTimer:
    """Collects StepTiming records; the runner calls begin / launching / before_wait / end in each step."""

    device: torch.device
    records: list[StepTiming] = field(default_factory=list)

    def begin(self) -> None:
        self._t0 = time.perf_counter()
        self._events = None

    def launching(self) -> None:
        """The batch is staged; the forward pass is launched next."""
        if self.device.type == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()

    def before_wait(self) -> None:
        if self._events is not None:
            self._events[1].record()
        self._t1 = time.perf_counter()

    def end(self, num_seqs: int, num_tokens: int, graphed: bool, context_tokens: int) -> None:
        t2 = time.perf_counter()
        gpu_ms = 0.0
        if self._events is not None:
            self._events[1].synchronize()  # already done after the step's sync; a step that samples nothing waits here
            gpu_ms = self._events[0].elapsed_time(self._events[1])
        self.records.append(
            StepTiming(self._t1 - self._t0, t2 - self._t1, gpu_ms, num_seqs, num_tokens, graphed, context_tokens)
        )
