"""Rotary frequencies of every supported rope type against transformers' own."""

from __future__ import annotations

import pytest
import torch

from engine.models.layers.rotary import build_cos_sin_cache, inverse_frequencies, rope_parameters

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def llama_config(**kwargs: object):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=131072, **kwargs)


@pytest.mark.parametrize(
    "rope_scaling",
    [None, {"rope_type": "default"}, {"type": "linear", "factor": 4.0}, LLAMA3],
    ids=["none", "default", "linear", "llama3"],
)
def test_inverse_frequencies_match_transformers(rope_scaling: dict | None) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = llama_config(rope_theta=500000.0, rope_scaling=rope_scaling)
    theta, scaling = rope_parameters(config)
    assert theta == 500000.0
    ours = inverse_frequencies(128, theta, scaling)
    if scaling["rope_type"] == "default":
        expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, torch.device("cpu"))
    assert torch.equal(ours, expected.float())


def test_cos_sin_cache_layout() -> None:
    cache = build_cos_sin_cache(8, 10, 10000.0, {"rope_type": "default"})
    assert cache.shape == (10, 8) and cache.dtype == torch.float32
    angles = 3 * inverse_frequencies(8, 10000.0, {"rope_type": "default"})
    assert torch.allclose(cache[3], torch.cat((angles.cos(), angles.sin())))


def test_unsupported_rope_type_is_named() -> None:
    config = llama_config(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        rope_parameters(config)
