"""Every out-of-range sampling parameter is a ValueError that names the field and the limit; the values
at each limit are accepted and the values just past it refused."""

import math

import pytest

from engine.sampling_params import (
    EXCLUSIVE_LOW,
    GREEDY_TEMPERATURE,
    INTEGER_PARAMS,
    SAMPLING_LIMITS,
    SamplingParams,
    check_priority,
)


@pytest.mark.parametrize(
    "kwargs,field,limit",
    [
        ({"temperature": -1.0}, "temperature", "[0, 2]"),
        ({"temperature": math.nan}, "temperature", "a number in [0, 2]"),
        ({"temperature": "hot"}, "temperature", "a number in [0, 2]"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": -2}, "top_k", "an integer in [-1, 2**31 - 1]"),
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -3.0}, "frequency_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty", "[0.01, 10]"),
        ({"n": 0}, "n", "[1, 16]"),
        ({"n": 17}, "n", "[1, 16]"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop", "at most 16"),
        ({"stop": ["x" * 300]}, "stop", "at most 256"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"max_tokens": 0}, "max_tokens", "[1, 2**31 - 1]"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "max_tokens"),
        ({"seed": -1}, "seed", "[0, 2**63 - 1]"),
        ({"logit_bias": {5: 101.0}}, "logit_bias[5]", "[-100, 100]"),
    ],
)
def test_out_of_range_names_field_and_limit(kwargs, field, limit):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert field in str(err.value) and limit in str(err.value)


def test_defaults_and_spellings():
    p = SamplingParams(stop="END", top_k=0, temperature=0)
    assert p.stop == ["END"] and p.effective_top_k == 0 and p.is_greedy


def _edges(name: str) -> tuple[list, list]:
    """(accepted, refused) values at the limits of one field: the limits themselves (the smallest value above
    an exclusive low) and the values just past them (the next float, or the next integer)."""
    low, high = SAMPLING_LIMITS[name]
    if name in INTEGER_PARAMS:
        return [low, high], [low - 1, high + 1]
    if name in EXCLUSIVE_LOW:
        return [math.nextafter(low, math.inf), high], [low, math.nextafter(high, math.inf)]
    return [low, high], [math.nextafter(low, -math.inf), math.nextafter(high, math.inf)]


# The limits as a user reads them in the error (the numbers the API quotes too).
LIMIT_TEXT = {
    "n": "an integer in [1, 16]",
    "temperature": "a number in [0, 2]",
    "top_p": "a number in (0, 1]",
    "top_k": "an integer in [-1, 2**31 - 1]",
    "min_p": "a number in [0, 1]",
    "presence_penalty": "a number in [-2, 2]",
    "frequency_penalty": "a number in [-2, 2]",
    "repetition_penalty": "a number in [0.01, 10]",
    "seed": "an integer in [0, 2**63 - 1]",
    "max_tokens": "an integer in [1, 2**31 - 1]",
    "min_tokens": "an integer in [0, 2**31 - 1]",
    "logprobs": "an integer in [0, 20]",
    "prompt_logprobs": "an integer in [0, 20]",
}


@pytest.mark.parametrize("name", sorted(SAMPLING_LIMITS))
def test_every_numeric_field_accepts_its_limits_and_refuses_just_past_them(name):
    assert set(LIMIT_TEXT) == set(SAMPLING_LIMITS)
    accepted, refused = _edges(name)
    extra = {"max_tokens": None} if name == "min_tokens" else {}  # min_tokens is also capped by max_tokens
    for value in accepted:
        assert getattr(SamplingParams(**{name: value, **extra}), name) == value
    for value in refused:
        with pytest.raises(ValueError) as err:
            SamplingParams(**{name: value, **extra})
        assert str(err.value) == f"{name} must be {LIMIT_TEXT[name]}, got {value!r}"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"top_k": 2**63}, "top_k must be an integer in [-1, 2**31 - 1], got 9223372036854775808"),
        ({"top_k": 2**70}, "top_k must be an integer in [-1, 2**31 - 1]"),
        ({"top_k": 2.0}, "top_k must be an integer"),
        ({"n": True}, "n must be an integer in [1, 16], got True"),
        ({"repetition_penalty": 5e-324}, "repetition_penalty must be a number in [0.01, 10], got 5e-324"),
        ({"temperature": math.inf}, "temperature must be a number in [0, 2], got inf"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias key must be an integer in [0, 2**31 - 1], got -1"),
        ({"logit_bias": {2**31: 1.0}}, "logit_bias key must be an integer in [0, 2**31 - 1]"),
        ({"logit_bias": {5: -100.5}}, "logit_bias[5] must be a number in [-100, 100], got -100.5"),
        ({"stop_token_ids": [3, 2**31]}, "stop_token_ids[1] must be an integer in [0, 2**31 - 1]"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0] must be an integer in [0, 2**31 - 1]"),
        ({"stop_token_ids": list(range(65))}, "stop_token_ids may hold at most 64 ids"),
        ({"seed": 2**63}, "seed must be an integer in [0, 2**63 - 1]"),
        ({"logprobs": 21}, "logprobs must be an integer in [0, 20], got 21"),
    ],
)
def test_values_past_the_limits_are_refused_naming_the_field(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert fragment in str(err.value)


def test_token_ids_and_bias_at_their_limits_are_accepted():
    p = SamplingParams(logit_bias={0: -100.0, 2**31 - 1: 100}, stop_token_ids=[0, 2**31 - 1] + [7] * 62)
    assert p.logit_bias == {0: -100.0, 2**31 - 1: 100} and len(p.stop_token_ids) == 64


def test_priority_limits():
    check_priority(2**31 - 1)
    check_priority(-(2**31 - 1))
    for bad in (2**31, -(2**31), 1.0, True):
        with pytest.raises(ValueError, match=r"priority must be an integer in \[-\(2\*\*31 - 1\), 2\*\*31 - 1\]"):
            check_priority(bad)


@pytest.mark.parametrize("temperature", [0.0, 5e-324, 1e-300, 1e-6, math.nextafter(GREEDY_TEMPERATURE, 0)])
def test_temperature_below_the_greedy_threshold_is_greedy(temperature):
    assert GREEDY_TEMPERATURE == 1e-5
    assert SamplingParams(temperature=temperature).is_greedy


@pytest.mark.parametrize("temperature", [GREEDY_TEMPERATURE, 0.5, 2.0])
def test_temperature_from_the_threshold_on_samples(temperature):
    assert not SamplingParams(temperature=temperature).is_greedy


def test_boolean_fields_refuse_other_values() -> None:
    for name in ("ignore_eos", "skip_special_tokens", "speculative"):
        with pytest.raises(ValueError, match=f"{name} must be true or false, got 1"):
            SamplingParams(**{name: 1})
    assert SamplingParams(speculative=False).speculative is False
