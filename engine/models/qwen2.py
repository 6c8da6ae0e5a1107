"""Qwen2 / Qwen2.5: Llama with biases on the q, k and v projections (none on o).

Sliding-window attention (`use_sliding_window`, off in every released Qwen2 config) applies the
config's `sliding_window` to the layers from `max_window_layers` on, as transformers' `layer_types` says.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.models.layers import RotaryEmbedding
from engine.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Args: config: a transformers Qwen2Config."""

    def make_attention(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> nn.Module:
        return LlamaAttention(config, rotary, qkv_bias=True, o_bias=False, layer_idx=layer_idx)
