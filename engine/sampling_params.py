"""Sampling parameters of one request, validated on creation.

Every limit a user can hit is checked here, once, with a message that names the
field and the limit (the API repeats these checks to answer 400 early, but the
engine never trusts its caller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Limits. Kept as module constants so the API can quote the same numbers.
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256
MAX_LOGPROBS = 20
MAX_N = 16
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_SEED = 2**63 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop.

    Args:
        n: number of independent completions of the prompt (they share its KV blocks).
        temperature: 0 means greedy; otherwise logits are divided by it.
        top_p: nucleus sampling mass in (0, 1].
        top_k: keep the k most likely tokens; -1 (or 0) disables.
        min_p: drop tokens whose probability is below min_p times the top one.
        presence_penalty, frequency_penalty: OpenAI-style, in [-2, 2], over generated tokens.
        repetition_penalty: HF-style, > 0, over prompt and generated tokens (1 disables).
        logit_bias: token id -> bias in [-100, 100], added to the logits.
        seed: makes sampling reproducible; the random draw for a token is a function of
            (seed, position) only, so a request restarted from any point continues identically.
        stop: strings that end the output (not included in it).
        stop_token_ids: token ids that end the output (in addition to EOS).
        max_tokens: most tokens to generate; None means up to the context length.
        min_tokens: EOS and stop tokens are suppressed before this many tokens.
        ignore_eos: keep generating past EOS (benchmarks).
        logprobs: if set, return the chosen token's logprob and this many top alternatives.
        prompt_logprobs: if set, return each prompt token's logprob given the tokens before it (none for the
            first), with this many top alternatives; computed during prefill, which then bypasses the prefix cache.
        skip_special_tokens: drop special tokens from the detokenized text.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        _finite("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _finite("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= -1 (-1 or 0 disables), got {self.top_k!r}")
        _finite("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _finite(name, value)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _finite("repetition_penalty", self.repetition_penalty)
        if not 0 < self.repetition_penalty <= 10:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if self.logit_bias:
            if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
                raise ValueError(
                    f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(self.logit_bias)}"
                )
            for token, bias in self.logit_bias.items():
                _finite(f"logit_bias[{token}]", bias)
                if not -100 <= bias <= 100:
                    raise ValueError(f"logit_bias[{token}] must be in [-100, 100], got {bias}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"stop may hold at most {MAX_STOP_SEQUENCES} strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
            if len(s) > MAX_STOP_SEQUENCE_CHARS:
                raise ValueError(f"each stop string may be at most {MAX_STOP_SEQUENCE_CHARS} characters, got {len(s)}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def effective_top_k(self) -> int:
        """top_k with 'disabled' spelled as 0."""
        return 0 if self.top_k in (-1, 0) else self.top_k
