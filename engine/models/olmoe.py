"""OLMoE (OLMoE-1B-7B): Llama-shaped, with an RMSNorm over the WHOLE q and k projections (not per head,
unlike Qwen3), optional clipping of q, k and v (`clip_qkv`), and on every layer `num_experts` experts of
`intermediate_size`, top-k, renormalized with `norm_topk_prob`.

Legend: T = new tokens, Hq/Hkv = query/KV heads, D = head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.attention_metadata import AttentionMetadata
from engine.models.layers import RMSNorm, RotaryEmbedding
from engine.models.llama import LlamaAttention
from engine.models.moe_base import MoEForCausalLM
from engine.models.moe_spec import MoEFields


class OlmoeAttention(LlamaAttention):
    """LlamaAttention with q_norm [Hq*D] and k_norm [Hkv*D] over the projections' whole rows, then the clip.

    NOTE: always the unfused path (norm + qkv projection, then the norms, then RoPE with the KV store):
    the one-token fused kernels rotate q and k straight out of the projection.
    """

    def __init__(self, config: Any, rotary: RotaryEmbedding, *, qkv_bias: bool, o_bias: bool, layer_idx: int) -> None:
        super().__init__(config, rotary, qkv_bias=qkv_bias, o_bias=o_bias, layer_idx=layer_idx)
        self.q_norm = RMSNorm(self.num_heads * self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.num_kv_heads * self.head_dim, config.rms_norm_eps)
        self.clip_qkv = getattr(config, "clip_qkv", None)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm: RMSNorm,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        qkv, residual = norm.project(hidden, residual, self.qkv_proj)  # [T, (Hq + 2 Hkv) * D], [T, H]
        q, k, v = self.qkv_proj.split(qkv)
        q, k = self.q_norm(q), self.k_norm(k)  # [T, Hq*D], [T, Hkv*D], new tensors
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        rotary = (positions, self.rotary_emb.cos_sin_cache)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta, rotary)), residual


class OlmoeForCausalLM(MoEForCausalLM):
    """Args: config: a transformers OlmoeConfig."""

    # q_norm and k_norm span every head's rows, which a tensor-parallel rank does not hold
    supports_tensor_parallel = False

    MOE_FIELDS = MoEFields(num_experts="num_experts", intermediate_size="intermediate_size",
                           norm_topk_prob="norm_topk_prob")  # fmt: skip

    def make_attention(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return OlmoeAttention(config, rotary, qkv_bias=bias, o_bias=bias, layer_idx=layer_idx)
