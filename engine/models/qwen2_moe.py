"""Qwen2-MoE (Qwen1.5-MoE-A2.7B): Qwen2 attention (q/k/v biases), and on the sparse layers E routed
experts (top-k, renormalized only with `norm_topk_prob`) plus a shared expert every token goes through,
scaled by sigmoid(shared_expert_gate(x)). `decoder_sparse_step` and `mlp_only_layers` choose the sparse
layers; the others have a dense MLP of `intermediate_size`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.models.layers import RotaryEmbedding
from engine.models.llama import LlamaAttention
from engine.models.moe_base import MoEForCausalLM
from engine.models.moe_spec import MoEFields


class Qwen2MoeForCausalLM(MoEForCausalLM):
    """Args: config: a transformers Qwen2MoeConfig."""

    MOE_FIELDS = MoEFields(
        num_experts="num_experts",
        intermediate_size="moe_intermediate_size",
        norm_topk_prob="norm_topk_prob",
        shared_expert_intermediate_size="shared_expert_intermediate_size",
        sparse_step=True,
    )

    def make_attention(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> nn.Module:
        # NOTE: `qkv_bias` is transformers 5's field; released config.json files lack it and mean True
        bias = bool(getattr(config, "qkv_bias", True))
        return LlamaAttention(config, rotary, qkv_bias=bias, o_bias=False, layer_idx=layer_idx)
