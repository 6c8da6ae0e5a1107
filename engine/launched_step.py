"""A step whose work is queued on the device: what async scheduling holds between launching
step k and reading its tokens after step k+1 is launched.

Legend: S = rows that sample in the step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.request import Logprob, Request
from engine.step_timer import StepClock


@dataclass
class ModelRunnerOutput:
    """Per sampling request (in scheduling order): its new token, logprob and error; and the prompt logprobs of
    the step's chunks that computed some (engine/prompt_logprobs.py): (request, first position, logprobs).
    A verification step (speculative decoding) also has `verified`: each request's kept tokens, first of
    which are token_ids and logprobs."""

    requests: list[Request]
    token_ids: list[int]
    logprobs: list[Logprob | None]
    errors: list[str | None]
    prompt_logprobs: list[tuple[Request, int, list[Logprob]]] = field(default_factory=list)
    # a step that verified proposed tokens: per request, its kept tokens (engine/spec_verify.py's Verified)
    verified: list | None = None


@dataclass
class SampledTokens:
    """The device side of a step's samples: where the next step finds a pending token's id
    before the host has read it.

    Args:
        token_ids: [S] int64 on the model's device, row i sampled for requests[i].
        requests: the S requests, in row order.
    """

    token_ids: torch.Tensor
    requests: list[Request]

    @functools.cached_property
    def row_of(self) -> dict[Request, int]:
        """request -> its row (requests hash by identity); built only when a next step has a
        pending token to look up (synchronous steps never do)."""
        return {request: row for row, request in enumerate(self.requests)}


class LaunchedStep:
    """A launched step. `result()` waits for its tokens (the step's one sync) and returns them;
    it may be called once.

    Args:
        requests: the requests that sample in the step, in row order.
        read: blocks until the tokens are on the host and returns the step's output.
        on_done: called with the seconds `read` blocked (the runner's timer), or None.
    """

    def __init__(
        self,
        requests: list[Request],
        read: Callable[[], ModelRunnerOutput],
        on_done: Callable[[float], None] | None = None,
    ) -> None:
        self.requests = requests
        self._read = read
        self._on_done = on_done
        self._output: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        if self._output is None:
            started = time.perf_counter()
            self._output = self._read()
            if self._on_done is not None:
                self._on_done(time.perf_counter() - started)
        return self._output


def timer_hook(
    timer, clock: StepClock | None, num_seqs: int, num_tokens: int, graphed: bool, context_tokens: int
) -> Callable[[float], None] | None:
    """The LaunchedStep's on_done that files the step's timing (None when no timer is set)."""
    if timer is None or clock is None:
        return None
    return lambda wait_s: timer.finish(clock, wait_s, num_seqs, num_tokens, graphed, context_tokens)
