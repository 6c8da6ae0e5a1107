"""The value types of request fields: every number with both bounds, token ids, logit_bias keys.

Each bound is published in the OpenAPI document (minimum/maximum) and enforced by the same
annotation, so a value the document admits is a value the API accepts. Limits that need the
served model (vocabulary, context length) are checked later, in api/limits.py.

Integers: JSON has one number type, and JSON Schema's "integer" admits 5.0; so does vLLM
(pydantic's lax mode). An integral float is taken as that integer; 5.5, true and "5" stay
refused (docs/decisions/0035-request-bounds-and-published-schema.md).
"""

from __future__ import annotations

import re
import sys
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from worker.protocol import sampling_limits as _limits

# NOTE: the numbers come from the Redis contract's table (worker/protocol/sampling_limits.py), which
# the protocol checks on decode and the engine repeats (engine/sampling_params.py); the API checks them
# again to answer 400 before anything is enqueued.
MAX_N = _limits.SAMPLING_LIMITS["n"][1]
MAX_STOP_SEQUENCES = _limits.MAX_STOP_SEQUENCES
MAX_STOP_SEQUENCE_CHARS = _limits.MAX_STOP_SEQUENCE_CHARS
MAX_LOGPROBS = _limits.SAMPLING_LIMITS["logprobs"][1]
MAX_LOGIT_BIAS_ENTRIES = _limits.MAX_LOGIT_BIAS_ENTRIES
MAX_LOGIT_BIAS = _limits.LOGIT_BIAS_LIMITS[1]
MAX_SEED = _limits.SEED_MAX
# NOTE: published as seed's exclusive maximum: a float bound, as OpenAPI documents hold them, is exact
# for 2**63 and not for 2**63 - 1 (which rounds up to 2**63, a seed the API refuses).
SEED_BOUND = MAX_SEED + 1
MAX_MESSAGES = 1024
MAX_STOP_TOKEN_IDS = _limits.MAX_STOP_TOKEN_IDS
MAX_PRIORITY = _limits.PRIORITY_LIMITS[1]
MAX_TOKEN_ID = _limits.TOKEN_ID_LIMITS[1]
MAX_TOP_K = _limits.SAMPLING_LIMITS["top_k"][1]
MAX_TEMPERATURE = _limits.SAMPLING_LIMITS["temperature"][1]
MAX_PENALTY = _limits.SAMPLING_LIMITS["presence_penalty"][1]
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = _limits.SAMPLING_LIMITS["repetition_penalty"]
# Structured output and tools (the contract of params.structured_output and the message's tools).
MAX_STRUCTURED_OUTPUT_CHARS = _limits.MAX_STRUCTURED_OUTPUT_CHARS  # the constraint value's JSON text
MAX_CHOICES = _limits.MAX_CHOICES
MAX_CHOICE_CHARS = _limits.MAX_CHOICE_CHARS
MAX_TOOLS = _limits.MAX_TOOLS
# The engine samples greedily below this temperature (vLLM's rule: dividing logits by a
# subnormal temperature overflows them).
GREEDY_BELOW_TEMPERATURE = 1e-5


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _integral_items(value: Any, validate: ValidatorFunctionWrapHandler) -> Any:
    # NOTE: the strict list validation runs first, in Rust; only a list it refuses is searched for integral
    # floats, so a long token-id prompt of plain ints costs no Python loop.
    try:
        return validate(value)
    except ValidationError:
        if isinstance(value, list) and any(type(item) is float for item in value):
            return validate([_integral(item) for item in value])
        raise


def _float_sized(value: Any) -> Any:
    # NOTE: an int beyond a float's range (10**400) would fail as "not a valid number"; as the largest
    # float it fails the bound instead, and the message names the limit (no bound here is near it).
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        return sys.float_info.max if value > 0 else -sys.float_info.max
    return value


def integer(
    lo: int | None = None, hi: int | None = None, *, lt: int | None = None, description: str | None = None
) -> Any:
    """An integer in [lo, hi] (or [lo, lt)): an int or an integral float, never a bool or a string."""
    return Annotated[int, Strict(), Field(ge=lo, le=hi, lt=lt, description=description), BeforeValidator(_integral)]


def number(
    lo: float | None = None, hi: float | None = None, *, gt: float | None = None, description: str | None = None
) -> Any:
    """A finite number in [lo, hi] (or (gt, hi]): an int or a float, never a bool or a string."""
    return Annotated[
        float,
        Strict(),
        Field(ge=lo, le=hi, gt=gt, allow_inf_nan=False, description=description),
        BeforeValidator(_float_sized),
    ]


# NOTE: no per-item validator here (a Python call per id of a long prompt); the list's own
# validator turns integral floats into ints, only when the list holds one.
TokenId = Annotated[int, Strict(), Field(ge=0, le=MAX_TOKEN_ID)]


def token_ids(min_length: int = 0, max_length: int | None = None, description: str | None = None) -> Any:
    return Annotated[
        list[TokenId],  # type: ignore[valid-type]
        Field(min_length=min_length, max_length=max_length, description=description),
        WrapValidator(_integral_items),
    ]


# A logit_bias key: a token id in ASCII decimal digits. Leading zeros are read as vLLM's int(key) reads
# them ("007" is token 7; two keys naming one token: the later one counts, as in vLLM); a sign, spaces,
# "_" and non-ASCII digits ("٣", "１", "²", "①") are refused. At most 20 digits: every token id fits,
# and int() never sees a long string. Whether the token is in the vocabulary is checked in api/limits.py.
MAX_LOGIT_BIAS_KEY_DIGITS = 20
LOGIT_BIAS_KEY = f"^[0-9]{{1,{MAX_LOGIT_BIAS_KEY_DIGITS}}}$"
_LOGIT_BIAS_KEY = re.compile(LOGIT_BIAS_KEY)


def logit_bias_token(key: str) -> int:
    """The token id a logit_bias key names; ValueError with a message naming the key otherwise."""
    if not _LOGIT_BIAS_KEY.fullmatch(key):
        shown = repr(key[:40]) + ("..." if len(key) > 40 else "")  # repr escapes unpaired surrogates
        raise ValueError(
            f"key {shown} is not a token id: keys are token ids written with 1 to {MAX_LOGIT_BIAS_KEY_DIGITS} "
            'ASCII digits (0-9), like "50256"'
        )
    return int(key)
