"""The protocol checks every sampling value against worker/protocol/sampling_limits.py, the same limits as the
engine's SamplingParams (which the protocol may not import): equal tables, and the same verdict on the values
at and just past every limit."""

from __future__ import annotations

import json
import math

import pytest

from engine import sampling_params as engine_limits
from engine.sampling_params import SamplingParams
from worker.protocol import ProtocolError, decode_request
from worker.protocol import sampling_limits as wire_limits

SHARED = [
    "SAMPLING_LIMITS", "INTEGER_PARAMS", "EXCLUSIVE_LOW", "OPTIONAL_PARAMS", "LOGIT_BIAS_LIMITS",
    "MAX_LOGIT_BIAS_ENTRIES", "TOKEN_ID_LIMITS", "MAX_STOP_TOKEN_IDS", "MAX_STOP_SEQUENCES", "MAX_STOP_SEQUENCE_CHARS",
    "PRIORITY_LIMITS", "BOOLEAN_PARAMS", "STRUCTURED_OUTPUT_KINDS", "MAX_STRUCTURED_OUTPUT_CHARS", "MAX_CHOICES",
    "MAX_CHOICE_CHARS",
]  # fmt: skip


@pytest.mark.parametrize("name", SHARED)
def test_the_engine_and_the_protocol_hold_the_same_limits(name):
    assert getattr(engine_limits, name) == getattr(wire_limits, name)
    # float limits stay floats and integer ones ints on both sides (they are quoted in errors)
    if name == "SAMPLING_LIMITS":
        for field, bounds in wire_limits.SAMPLING_LIMITS.items():
            kinds = {type(b) for b in (*bounds, *engine_limits.SAMPLING_LIMITS[field])}
            assert kinds == ({int} if field in wire_limits.INTEGER_PARAMS else {float}), field


def _decode(params: dict) -> dict:
    return decode_request({"v": "1", "id": "a", "prompt": "x", "params": json.dumps(params)}).params


def _edges(name: str) -> list:
    low, high = wire_limits.SAMPLING_LIMITS[name]
    if name in wire_limits.INTEGER_PARAMS:
        return [low - 1, low, high, high + 1, 2**63, 2**70, float(low)]
    return [math.nextafter(low, -math.inf), low, math.nextafter(low, math.inf), high, math.nextafter(high, math.inf),
            5e-324, -5e-324, 1e300, True, "1"]  # fmt: skip


@pytest.mark.parametrize("name", sorted(wire_limits.SAMPLING_LIMITS))
def test_the_protocol_and_the_engine_agree_at_every_limit(name):
    extra = {"max_tokens": None} if name == "min_tokens" else {}
    for value in _edges(name):
        try:
            SamplingParams(**{name: value, **extra})
            engine_ok = True
        except ValueError:
            engine_ok = False
        try:
            assert _decode({name: value, **extra})[name] == value
            wire_ok = True
        except ProtocolError as exc:
            assert exc.field == f"params.{name}"
            low, high = wire_limits.SAMPLING_LIMITS[name]
            assert wire_limits.format_bound(low) in exc.reason and wire_limits.format_bound(high) in exc.reason
            wire_ok = False
        assert wire_ok == engine_ok, (name, value)


@pytest.mark.parametrize(
    ("params", "field", "fragment"),
    [
        ({"top_k": 2**63}, "params.top_k", "must be an integer in [-1, 2**31 - 1], got 9223372036854775808"),
        ({"top_k": 2**70}, "params.top_k", "must be an integer in [-1, 2**31 - 1]"),
        ({"temperature": -1}, "params.temperature", "must be a number in [0, 2], got -1"),
        ({"top_p": 0}, "params.top_p", "must be a number in (0, 1], got 0"),
        ({"repetition_penalty": 5e-324}, "params.repetition_penalty", "must be a number in [0.01, 10], got 5e-324"),
        ({"seed": 2**63}, "params.seed", "must be an integer in [0, 2**63 - 1]"),
        ({"n": 17}, "params.n", "must be an integer in [1, 16], got 17"),
        ({"logprobs": 21}, "params.logprobs", "[0, 20]"),
        ({"max_tokens": 0}, "params.max_tokens", "[1, 2**31 - 1]"),
        ({"min_tokens": 5, "max_tokens": 2}, "params.min_tokens", "at most max_tokens (2), got 5"),
        ({"min_tokens": -1}, "params.min_tokens", "[0, 2**31 - 1]"),
        ({"logit_bias": {"5": 101}}, "params.logit_bias[5]", "must be a number in [-100, 100], got 101"),
        ({"logit_bias": {"-3": 1}}, "params.logit_bias", "keys (token ids) must be an integer in [0, 2**31 - 1]"),
        ({"logit_bias": {str(2**31): 1}}, "params.logit_bias", "[0, 2**31 - 1]"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "params.logit_bias", "at most 300 entries"),
        ({"stop_token_ids": [1, 2**31]}, "params.stop_token_ids[1]", "must be an integer in [0, 2**31 - 1]"),
        ({"stop_token_ids": [1.0]}, "params.stop_token_ids[0]", "must be an integer"),
        ({"stop_token_ids": list(range(65))}, "params.stop_token_ids", "at most 64"),
        ({"stop": ["a"] * 17}, "params.stop", "at most 16 strings"),
        ({"stop": ["x" * 257]}, "params.stop[0]", "1 to 256 characters"),
        ({"ignore_eos": "yes"}, "params.ignore_eos", "true or false"),
        ({"speculative": 0}, "params.speculative", "true or false, got 0"),
        ({"temperature": None}, "params.temperature", "a number in [0, 2], got None"),
    ],
)
def test_bad_values_name_the_field_and_the_limit(params, field, fragment):
    with pytest.raises(ProtocolError) as info:
        _decode(params)
    assert info.value.field == field
    assert fragment in info.value.reason


def test_values_at_the_limits_and_nulls_of_optional_fields_decode():
    params = {
        "n": 16, "temperature": 2, "top_p": 5e-324, "top_k": 2**31 - 1, "min_p": 1, "presence_penalty": -2,
        "frequency_penalty": 2.0, "repetition_penalty": 0.01, "seed": 2**63 - 1, "max_tokens": 5, "min_tokens": 5,
        "logprobs": 20, "logit_bias": {"0": -100, str(2**31 - 1): 100}, "stop_token_ids": [0, 2**31 - 1],
        "stop": "END", "ignore_eos": True, "skip_special_tokens": False, "speculative": False,
    }  # fmt: skip
    decoded = _decode(params)
    assert decoded["logit_bias"] == {0: -100, 2**31 - 1: 100}
    SamplingParams(**decoded)  # the engine takes what the protocol lets through
    assert _decode({"seed": None, "max_tokens": None, "logprobs": None, "logit_bias": None}) == {
        "seed": None, "max_tokens": None, "logprobs": None, "logit_bias": None
    }  # fmt: skip


@pytest.mark.parametrize("priority", [str(2**31), str(-(2**31)), "1e3"])
def test_priority_out_of_range_names_the_field(priority):
    with pytest.raises(ProtocolError) as info:
        decode_request({"v": "1", "id": "a", "prompt": "x", "priority": priority})
    assert info.value.field == "priority"
    assert "integer" in info.value.reason
    for ok in (2**31 - 1, -(2**31 - 1)):
        assert decode_request({"v": "1", "id": "a", "prompt": "x", "priority": str(ok)}).priority == ok
