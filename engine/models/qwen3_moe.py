"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3 attention (per-head q/k RMSNorm) and, on the sparse
layers, E routed experts (top-k, renormalized with `norm_topk_prob`) without a shared expert.
`decoder_sparse_step` and `mlp_only_layers` choose the sparse layers; the others have a dense MLP of
`intermediate_size`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.models.layers import RotaryEmbedding
from engine.models.moe_base import MoEForCausalLM
from engine.models.moe_spec import MoEFields
from engine.models.qwen3 import Qwen3Attention


class Qwen3MoeForCausalLM(MoEForCausalLM):
    """Args: config: a transformers Qwen3MoeConfig."""

    MOE_FIELDS = MoEFields(
        num_experts="num_experts",
        intermediate_size="moe_intermediate_size",
        norm_topk_prob="norm_topk_prob",
        sparse_step=True,
    )

    def make_attention(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return Qwen3Attention(config, rotary, qkv_bias=bias, o_bias=bias, layer_idx=layer_idx)
