"""The sampled tokens' way back to the host without a sync at launch.

A step's packed [2, R] int64 samples (token ids, 1 where the row's logits were all finite; R >= S, rows past
the requests' are a graph bucket's padding) are written into a pinned host buffer by a kernel queued behind
the sampling (kernels/write_to_host.py: no copy-engine op at the step's tail), and an event recorded behind
it; reading them is the step's one sync. Two buffers alternate between the two steps in flight (async
scheduling reads each step's result before it launches the step after the next). On the CPU the samples are
already on the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine import ops
from engine.launched_step import ModelRunnerOutput
from engine.request import Request


class SampleReadback:
    """Args: max_num_seqs: the most sampling rows a step has (with a graph bucket's padding, at most twice
    that fit the buffers' width); device: the runner's."""

    def __init__(self, max_num_seqs: int, device: torch.device) -> None:
        pinned = device.type == "cuda"
        self.host = torch.zeros((2, 2 * max_num_seqs), dtype=torch.int64, pin_memory=True) if pinned else None
        self._ready = [torch.cuda.Event(), torch.cuda.Event()] if pinned else []
        self._next_slot = 0

    def warm_up(self, packed: torch.Tensor) -> None:
        """Builds the hand-back kernel on a [2, 1] sample while the engine starts (a no-op on the CPU)."""
        if self.host is not None:
            ops.write_to_host(packed, self.host[0, :2].view(2, 1))

    def read_later(
        self, packed: torch.Tensor, requests: list[Request]
    ) -> tuple[torch.Tensor, Callable[[], ModelRunnerOutput]]:
        """(token ids on the device, read): `read` waits for the step and returns its output, built once (a
        constrained step's grammars read it before the engine does)."""
        num_rows = len(requests)
        if self.host is None:
            host, ready = packed, None
        else:
            slot = self._next_slot
            self._next_slot ^= 1
            width = packed.shape[1]
            host = self.host[slot, : 2 * width].view(2, width)
            ops.write_to_host(packed, host)
            ready = self._ready[slot]
            ready.record()
        done: list[ModelRunnerOutput] = []

        def read() -> ModelRunnerOutput:
            if done:
                return done[0]
            if ready is not None:
                ready.synchronize()
            tokens, ok = host[:, :num_rows].tolist()
            # The host has not appended these tokens yet: each one's position is the request's length.
            errors = [None] * num_rows
            if not all(ok):
                errors = [None if good else f"non-finite logits at position {r.num_tokens}" for r, good in
                          zip(requests, ok, strict=True)]  # fmt: skip
            done.append(ModelRunnerOutput(requests, tokens, [None] * num_rows, errors))
            return done[0]

        return packed[0], read
