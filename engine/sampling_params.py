"""Sampling parameters of one request, validated on creation.

Every limit a user can hit is checked here, once, with a message that names the
field and the limit (the API repeats these checks to answer 400 early, but the
engine never trusts its caller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.structured_output.constraint import (  # noqa: F401  (re-exported: the limits table lives here)
    MAX_CHOICE_CHARS,
    MAX_CHOICES,
    MAX_STRUCTURED_OUTPUT_CHARS,
    STRUCTURED_OUTPUT_KINDS,
    check_structured_output,
)

# Limits. The same table as worker/protocol/sampling_limits.py (which the API quotes): the engine imports
# nothing from worker/, so it keeps its own copy and tests/worker/test_protocol.py checks the two are equal.
INT32_MAX = 2**31 - 1
MAX_SEED = 2**63 - 1
SAMPLING_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "n": (1, 16),
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (-1, INT32_MAX),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.01, 10.0),
    "seed": (0, MAX_SEED),
    "max_tokens": (1, INT32_MAX),
    "min_tokens": (0, INT32_MAX),
    "logprobs": (0, 20),
    "prompt_logprobs": (0, 20),
}
INTEGER_PARAMS = frozenset({"n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"})
EXCLUSIVE_LOW = frozenset({"top_p"})
OPTIONAL_PARAMS = frozenset({"seed", "max_tokens", "logprobs", "prompt_logprobs", "logit_bias"})
BOOLEAN_PARAMS = ("ignore_eos", "skip_special_tokens", "speculative")
LOGIT_BIAS_LIMITS = (-100.0, 100.0)
MAX_LOGIT_BIAS_ENTRIES = 300
TOKEN_ID_LIMITS = (0, INT32_MAX)
MAX_STOP_TOKEN_IDS = 64
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256
PRIORITY_LIMITS = (-INT32_MAX, INT32_MAX)  # LLMEngine.add_request's priority (the message's field)
MAX_N = SAMPLING_LIMITS["n"][1]
MAX_LOGPROBS = SAMPLING_LIMITS["logprobs"][1]

# Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS): dividing logits by a
# subnormal or tiny temperature overflows float32 to inf, and the softmax of inf is NaN.
GREEDY_TEMPERATURE = 1e-5


def _format(value: int | float) -> str:
    """0, 0.01, 2**31 - 1: large limits read as the powers they come from."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    magnitude = abs(value) + 1
    if magnitude >= 2**16 and magnitude & (magnitude - 1) == 0:
        text = f"2**{magnitude.bit_length() - 1} - 1"
        return f"-({text})" if value < 0 else text
    return str(value)


def _check_range(
    name: str, value: object, low: int | float, high: int | float, *, integer: bool, low_open: bool = False
) -> None:
    """Raises ValueError naming the field and the limit unless low <= value <= high (low < value when low_open)."""
    ok = _is_int(value) if integer else _is_number(value) and math.isfinite(value)
    if not ok or not (low < value if low_open else low <= value) or not value <= high:
        kind = "an integer" if integer else "a number"
        interval = f"{'(' if low_open else '['}{_format(low)}, {_format(high)}]"
        raise ValueError(f"{name} must be {kind} in {interval}, got {value!r}")


def check_priority(priority: object) -> None:
    """A request's scheduling priority within PRIORITY_LIMITS (ValueError naming the field otherwise)."""
    _check_range("priority", priority, *PRIORITY_LIMITS, integer=True)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop.

    Args:
        n: number of independent completions of the prompt (they share its KV blocks).
        temperature: in [0, 2]; below 1e-5 (GREEDY_TEMPERATURE, vLLM's rule) sampling is greedy,
            otherwise logits are divided by it.
        top_p: nucleus sampling mass in (0, 1].
        top_k: keep the k most likely tokens, k in [-1, 2**31 - 1]; -1 (or 0) disables, and a k of
            the vocabulary's size or more keeps every token (the sampler clamps it).
        min_p: drop tokens whose probability is below min_p times the top one.
        presence_penalty, frequency_penalty: OpenAI-style, in [-2, 2], over generated tokens.
        repetition_penalty: HF-style, in [0.01, 10], over prompt and generated tokens (1 disables).
        logit_bias: token id -> bias in [-100, 100], added to the logits (ids in the vocabulary:
            LLMEngine.add_request checks them, as it does stop_token_ids).
        seed: makes sampling reproducible; the random draw for a token is a function of
            (seed, position) only, so a request restarted from any point continues identically.
        stop: strings that end the output (not included in it).
        stop_token_ids: token ids that end the output (in addition to EOS).
        max_tokens: most tokens to generate, >= 1; None means up to the context length.
        min_tokens: EOS and stop tokens are suppressed before this many tokens (at most max_tokens).
        ignore_eos: keep generating past EOS (benchmarks).
        logprobs: if set, return the chosen token's logprob and this many top alternatives (at most 20).
        prompt_logprobs: if set, return each prompt token's logprob given the tokens before it (none for the
            first), with this many top alternatives (at most 20); computed during prefill, which then bypasses
            the prefix cache.
        skip_special_tokens: drop special tokens from the detokenized text.
        speculative: False opts the request out of speculative decoding where the engine runs it (its
            tokens are the same either way; speculation only changes how fast they come).
        structured_output: a constraint on the output, an object with exactly one of `json` (a JSON Schema),
            `json_object` (true), `regex`, `choice` (a list of strings) or `grammar` (EBNF, root rule `root`);
            enforced by token masks (engine/structured_output/).
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
    speculative: bool = True
    structured_output: dict | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        for name in BOOLEAN_PARAMS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name, (low, high) in SAMPLING_LIMITS.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL_PARAMS:
                continue
            _check_range(name, value, low, high, integer=name in INTEGER_PARAMS, low_open=name in EXCLUSIVE_LOW)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logit_bias:
            if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
                raise ValueError(
                    f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(self.logit_bias)}"
                )
            for token, bias in self.logit_bias.items():
                _check_range("logit_bias key", token, *TOKEN_ID_LIMITS, integer=True)
                _check_range(f"logit_bias[{token}]", bias, *LOGIT_BIAS_LIMITS, integer=False)
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"stop may hold at most {MAX_STOP_SEQUENCES} strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
            if len(s) > MAX_STOP_SEQUENCE_CHARS:
                raise ValueError(f"each stop string may be at most {MAX_STOP_SEQUENCE_CHARS} characters, got {len(s)}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            count = len(self.stop_token_ids)
            raise ValueError(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {count}")
        for i, token in enumerate(self.stop_token_ids):
            _check_range(f"stop_token_ids[{i}]", token, *TOKEN_ID_LIMITS, integer=True)
        if self.structured_output is not None:
            check_structured_output(self.structured_output)

    @property
    def is_greedy(self) -> bool:
        """Temperature below GREEDY_TEMPERATURE (0 included) picks the most likely token."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def effective_top_k(self) -> int:
        """top_k with 'disabled' spelled as 0 (the sampler also turns a k of the vocabulary's size or more to 0)."""
        return 0 if self.top_k in (-1, 0) else self.top_k
