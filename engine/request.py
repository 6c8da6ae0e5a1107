"""One request's state inside the engine. Pure Python.

The scheduler only ever looks at `num_computed_tokens` against the tokens the request
holds: a request needs `num_tokens + num_pending_tokens - num_computed_tokens` more tokens
through the model (its whole prompt at first, then one per step, or more after a preemption).

A pending token is one a launched step samples but whose value the host has not read yet
(async scheduling: the engine schedules and launches step k+1 before it reads step k's
tokens; step k+1 takes that token's id from the device). At most one token is pending.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # a non-finite logit row, or a failed step


@dataclass
class Logprob:
    """The chosen token's log-probability and the top alternatives (token id -> logprob)."""

    token_id: int
    logprob: float
    top: dict[int, float]


@dataclass(eq=False)
class Request:
    """A sequence being generated.

    Args:
        request_id: unique id.
        prompt_token_ids: the prompt; a resumed request passes prompt + already-emitted
            tokens here and `num_prior_output_tokens` so limits and seeds stay the same.
        sampling_params: validated sampling parameters (n is expanded by the engine).
        eos_token_ids: ids that end the output unless `ignore_eos`.
        priority: lower runs first under the priority policy.
        seed: the resolved sampling seed (random when the caller gave none).
        num_prior_output_tokens: how many of the prompt's last tokens are output of an
            earlier run of this request (resumption after a worker died).
        parent_id: for n > 1, the id the caller knows; children wait for the first
            sibling's prompt so they can share its cached blocks.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    priority: int = 0
    seed: int = 0
    num_prior_output_tokens: int = 0
    parent_id: str | None = None
    choice_index: int = 0
    arrival_time: float = field(default_factory=time.monotonic)

    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[Logprob] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hits when first scheduled
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    first_scheduled_time: float | None = None
    num_pending_tokens: int = 0  # sampled by a launched step, value not read yet (0 or 1)
    # prompt + every output token allowed (max_tokens, max_model_len): LLMEngine.add_request always sets it, and
    # the engine's output loop stops a request at it; None only for requests the scheduler tests build
    max_num_tokens: int | None = None
    # the logprobs of prompt tokens 1.. so far (entry i is token i + 1's), while the request computes them: asked
    # for (prompt_logprobs) and not resumed (a resumed request's first run delivered them); None once delivered
    prompt_logprobs: list[Logprob] | None = None
    # speculative decoding: the tokens proposed to follow this one's, verified in the step being scheduled
    # (engine/speculator.py sets them before scheduling; the scheduler gives them budget when it can)
    proposed_token_ids: list[int] = field(default_factory=list)
    # the choice's grammar state (engine/structured_output/grammar_state.py) once its constraint compiled; None for
    # a request without structured_output
    grammar: Any = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt must hold at least one token")
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        params = self.sampling_params
        # the ids that end the output once min_tokens are out: built once, looked up for every token
        self.stop_token_set: frozenset[int] = frozenset(params.stop_token_ids).union(
            () if params.ignore_eos else self.eos_token_ids
        )
        if params.prompt_logprobs is not None and self.num_prior_output_tokens == 0:
            self.prompt_logprobs = []

    @property
    def computes_prompt_logprobs(self) -> bool:
        """Its prefill computes prompt logprobs (so it takes no cached prefix: every position's logits are needed)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1

    def add_prompt_logprobs(self, start: int, logprobs: list[Logprob]) -> None:
        """The logprobs of prompt tokens start + 1, start + 2, ...; those already held (a chunk computed again after
        a preemption) are skipped."""
        held = self.prompt_logprobs
        if held is None or start > len(held):
            return
        held.extend(logprobs[len(held) - start :])

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens counted across resumptions (limits apply to this)."""
        return self.num_prior_output_tokens + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def num_tokens_with_pending(self) -> int:
        """The tokens the request holds once its pending token is read: the next sampled
        token's position."""
        return len(self.all_token_ids) + self.num_pending_tokens

    @property
    def num_new_tokens_needed(self) -> int:
        """0 once the pending token is the last one the request may have: scheduling it again
        would compute a token past max_tokens or the model's context."""
        total = self.num_tokens_with_pending
        if self.num_pending_tokens and self.max_num_tokens is not None and total >= self.max_num_tokens:
            return 0
        return total - self.num_computed_tokens

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.error = error
