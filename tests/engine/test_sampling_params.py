"""Every out-of-range sampling parameter is a ValueError that names the field and the limit."""

import math

import pytest

from engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs,field,limit",
    [
        ({"temperature": -1.0}, "temperature", ">= 0"),
        ({"temperature": math.nan}, "temperature", "finite"),
        ({"temperature": "hot"}, "temperature", "finite"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": -2}, "top_k", ">= -1"),
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -3.0}, "frequency_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty", "(0, 10]"),
        ({"n": 0}, "n", "[1, 16]"),
        ({"n": 17}, "n", "[1, 16]"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop", "at most 16"),
        ({"stop": ["x" * 300]}, "stop", "at most 256"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "max_tokens"),
        ({"seed": -1}, "seed", "2**63"),
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
