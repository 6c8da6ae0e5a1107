"""The bounds of every sampling parameter a submitter may send: one table that the protocol checks
on decode, that the API can quote in its 400s, and that engine/sampling_params.py repeats (the
engine imports nothing from worker/; a test checks both copies are equal).

Stdlib only. Bounds are closed intervals except the exclusive lows in EXCLUSIVE_LOW.
"""

from __future__ import annotations

import math
from typing import Any

INT32_MAX = 2**31 - 1  # token ids, top_k, token counts, priority: what any int32 field can hold
SEED_MAX = 2**63 - 1

# field -> (low, high)
SAMPLING_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "n": (1, 16),
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (-1, INT32_MAX),  # -1 and 0 disable; the engine clamps k to the vocabulary when it samples
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.01, 10.0),
    "seed": (0, SEED_MAX),
    "max_tokens": (1, INT32_MAX),  # the engine also keeps prompt + max_tokens within the model's context
    "min_tokens": (0, INT32_MAX),  # and at most max_tokens
    "logprobs": (0, 20),
    "prompt_logprobs": (0, 20),
}
INTEGER_PARAMS = frozenset({"n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"})
EXCLUSIVE_LOW = frozenset({"top_p"})
OPTIONAL_PARAMS = frozenset({"seed", "max_tokens", "logprobs", "prompt_logprobs", "logit_bias"})  # null means "not set"
# true or false; "speculative": false opts a request out of speculative decoding (docs/speculative-decoding.md)
BOOLEAN_PARAMS = ("ignore_eos", "skip_special_tokens", "speculative")

LOGIT_BIAS_LIMITS = (-100.0, 100.0)  # each bias value
MAX_LOGIT_BIAS_ENTRIES = 300
TOKEN_ID_LIMITS = (0, INT32_MAX)  # logit_bias keys and stop_token_ids (the engine checks its vocabulary too)
MAX_STOP_TOKEN_IDS = 64
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256
PRIORITY_LIMITS = (-INT32_MAX, INT32_MAX)  # the message's `priority` field
# params.structured_output: exactly one of these keys; its value's JSON text at most this long
STRUCTURED_OUTPUT_KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_STRUCTURED_OUTPUT_CHARS = 65_536
MAX_CHOICES = 256  # params.structured_output.choice: 1 to 256 strings of 1 to 1024 characters
MAX_CHOICE_CHARS = 1024
MAX_TOOLS = 128  # the message's `tools` list


def format_bound(value: int | float) -> str:
    """0, 0.01, -1, 2**31 - 1: large limits read as the powers they come from."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    magnitude = abs(value) + 1
    if magnitude >= 2**16 and magnitude & (magnitude - 1) == 0:
        text = f"2**{magnitude.bit_length() - 1} - 1"
        return f"-({text})" if value < 0 else text
    return str(value)


def describe_range(low: int | float, high: int | float, *, integer: bool, low_open: bool = False) -> str:
    """'an integer in [-1, 2**31 - 1]', 'a number in (0, 1]'."""
    kind = "an integer" if integer else "a number"
    return f"{kind} in {'(' if low_open else '['}{format_bound(low)}, {format_bound(high)}]"


def range_error(
    value: Any, low: int | float, high: int | float, *, integer: bool, low_open: bool = False
) -> str | None:
    """Why `value` is not in the range ('must be an integer in [1, 16], got 17'), or None when it is."""
    if isinstance(value, bool):
        ok = False
    elif integer:
        ok = isinstance(value, int)
    else:
        ok = isinstance(value, (int, float)) and math.isfinite(value)
    if ok and (low < value if low_open else low <= value) and value <= high:
        return None
    shown = repr(value) if not isinstance(value, str) else repr(value[:40])
    return f"must be {describe_range(low, high, integer=integer, low_open=low_open)}, got {shown}"


def param_error(name: str, value: Any) -> str | None:
    """range_error of SAMPLING_LIMITS' field `name`."""
    low, high = SAMPLING_LIMITS[name]
    return range_error(value, low, high, integer=name in INTEGER_PARAMS, low_open=name in EXCLUSIVE_LOW)
