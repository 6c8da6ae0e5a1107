"""Qwen3: Llama with an RMSNorm over each query and key head before the rotation,
and head_dim taken from the config (128 for every size, whatever H / Hq is).

Legend: T = new tokens, Hq/Hkv = query/KV heads, D = head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.models.layers import RMSNorm, RotaryEmbedding
from engine.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """LlamaAttention plus q_norm / k_norm: RMSNorm over D, weights [D] shared by all heads."""

    def __init__(self, config: Any, rotary: RotaryEmbedding, *, qkv_bias: bool, o_bias: bool, layer_idx: int) -> None:
        super().__init__(config, rotary, qkv_bias=qkv_bias, o_bias=o_bias, layer_idx=layer_idx)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def qk_norm(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        # NOTE: normalized inside the RoPE + KV store kernel, in place in the fused qkv output: as
        # modules of their own the two norms were two more kernels per layer, each writing a copy.
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Args: config: a transformers Qwen3Config."""

    def make_attention(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return Qwen3Attention(config, rotary, qkv_bias=bias, o_bias=bias, layer_idx=layer_idx)
