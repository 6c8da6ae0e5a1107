"""Paged attention as a layer: store this step's K/V in the pool, then attend.

Legend: T = new tokens (all sequences, flattened), Hq/Hkv = query/KV heads, D = head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from engine import attention_ops
from engine.attention_metadata import AttentionMetadata


class PagedAttention(nn.Module):
    """Causal attention of the new tokens over their sequence's cached K/V plus themselves.

    Args:
        num_heads: Hq.
        num_kv_heads: Hkv (Hq must be a multiple: grouped-query attention).
        head_dim: D.
        scale: softmax scale (usually D ** -0.5).
        sliding_window: the layer's window (a query sees its last `sliding_window` positions), or None.
    """

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int | None = None
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
        self.sliding_window = sliding_window

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    ) -> torch.Tensor:
        """q [T, Hq*D] or [T, Hq, D]; k, v [T, Hkv*D] or [T, Hkv, D] -> [T, Hq*D].

        rotary: (positions [T], cos_sin_cache [P, D]) to apply RoPE to q and k here, fused
        with the store (one kernel instead of two per layer); None when q and k arrive
        rotated or the model has no rotary embedding (GPT-2).
        qk_norm: (q_weight [D], k_weight [D], eps): RMSNorm each head of q and k before the
        rotation, in the same kernel (Qwen3); only with rotary.
        NOTE: q, k, v may be views into a fused QKV output (last dim contiguous, row
        stride (Hq + 2 Hkv) * D); the ops accept that layout.
        """
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if rotary is None:
            if qk_norm is not None:
                raise ValueError("qk_norm is applied with the rotation: pass rotary too")
            attention_ops.store_kv(k, v, kv_cache, meta.slot_mapping)
        else:
            positions, cos_sin_cache = rotary
            attention_ops.rope_store_kv(q, k, v, positions, cos_sin_cache, kv_cache, meta.slot_mapping, qk_norm)
        return self.attend(q, kv_cache, meta)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, Hq*D] or [T, Hq, D], rotated, over the pool that already holds this step's K/V -> [T, Hq*D]."""
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        out = attention_ops.paged_attention(q, kv_cache, meta, self.scale, self.sliding_window)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)
