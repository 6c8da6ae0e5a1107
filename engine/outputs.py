"""What the engine hands back each step, and the counters it keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Logprob


@dataclass(slots=True)  # one per running request per step: slots make it cheaper to build
class RequestOutput:
    """New output of one choice of one request in one step.

    Args:
        request_id: the id given to `add_request`.
        index: the choice index (0 unless n > 1).
        new_token_ids: tokens generated in this step (empty when finishing without one).
        new_text: text that became safe to emit in this step.
        new_logprobs: per new token, when the request asked for logprobs.
        finished: whether this choice is done.
        finish_reason: "stop", "length", "abort" or "error" when finished.
        num_prompt_tokens: prompt length (without resumed output).
        num_output_tokens: tokens generated so far, resumed ones included.
        error: message when finish_reason is "error".
        prompt_logprobs: with the choice's first token, when the request asked for them.
    """

    request_id: str
    index: int
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[Logprob] | None
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None
    prompt_logprobs: PromptLogprobs | None = None


@dataclass
class PromptLogprobs:
    """A prompt's tokens and the logprob of each after the first, given the tokens before it.

    Args:
        token_ids: the prompt.
        logprobs: logprobs[i] is token_ids[i + 1]'s, with the top alternatives asked for.
    """

    token_ids: list[int]
    logprobs: list[Logprob]


@dataclass
class StepRecord:
    """What the last step did (for tests, metrics and the worker's time window)."""

    step: int = 0
    scheduled: dict[str, int] = field(default_factory=dict)  # internal request id -> new tokens
    new_request_ids: list[str] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    duration_s: float = 0.0


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    kv_usage: float
    prefix_cache_hit_rate: float
    num_preemptions: int
    num_generated_tokens: int
    num_prompt_tokens_computed: int
    num_steps: int
    # speculative decoding (engine/speculator.py's SpecDecodeStats; zeros when it is off)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()

    @property
    def num_free_kv_tokens(self) -> int:
        return self.num_free_blocks * self.block_size
