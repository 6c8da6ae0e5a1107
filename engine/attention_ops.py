"""Where the paged KV pool is written and attended over: each op chooses, per call, its Triton kernel
(kernels/kv_store.py, rope_store_kv.py, decode_attention.py, prefill_attention.py) or the torch reference; the
choice follows engine/ops.py's process-wide kernel backend (`use_triton`). The layer is
engine/models/layers/attention.py's; the one-token path that stores K/V inside the qkv projection
(rms_norm_qkv_rope) stays in engine/ops.py with the other fused projections.

Legend: T = tokens, Hq / Hkv = query / KV heads, D = head size, N = blocks in the pool, B = block size.
"""

from __future__ import annotations

import torch

from engine.attention_metadata import AttentionMetadata
from engine.ops import use_triton
from kernels.decode_attention import paged_decode_attention_ref
from kernels.kv_store import store_kv_ref
from kernels.prefill_attention import paged_prefill_attention_ref
from kernels.rope_store_kv import rope_store_kv_ref


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes k, v [T, Hkv, D] into kv_cache [2, N, B, Hkv, D] at slot_mapping [T]."""
    if use_triton(k):
        from kernels.kv_store import store_kv as kernel

        kernel(k, v, kv_cache[0], kv_cache[1], slot_mapping)
        return
    store_kv_ref(k, v, kv_cache[0], kv_cache[1], slot_mapping)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> None:
    """Rotates q in place and writes rope(k), v [T, Hkv, D] into kv_cache [2, N, B, Hkv, D] at slot_mapping.

    k itself is left unrotated: attention reads keys from the pool only. qk_norm: (q_weight [D],
    k_weight [D], eps) to RMSNorm each head of q and k before the rotation (Qwen3), in the same kernel.
    """
    if use_triton(q):
        from kernels.rope_store_kv import rope_store_kv as kernel

        kernel(q, k, v, positions, cos_sin_cache, kv_cache[0], kv_cache[1], slot_mapping, qk_norm=qk_norm)
        return
    rope_store_kv_ref(q, k, v, positions, cos_sin_cache, kv_cache[0], kv_cache[1], slot_mapping, qk_norm=qk_norm)


def decode_order(meta: AttentionMetadata, num_kv_heads: int) -> torch.Tensor | None:
    """The decode kernel's order of the batch's sequences (longest context first) where the kernel
    wants one (kernels/decode_grid.py's wants_length_order), else None. Computed once a step,
    before the forward: a torch op, so it is complete before the step's first PDL kernel starts and
    the kernel may read it before its wait (kernels/_pdl.py)."""
    if not (meta.is_decode_only and use_triton(meta.seq_lens)):
        return None
    from kernels.decode_grid import length_order, wants_length_order

    if not wants_length_order(meta.num_seqs, num_kv_heads, meta.seq_lens.device):
        return None
    return length_order(meta.seq_lens)


def paged_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, window: int | None = None
) -> torch.Tensor:
    """Attention of q [T, Hq, D] over the paged pool kv_cache [2, N, B, Hkv, D] -> [T, Hq, D]; window: the
    layer's sliding window (a query sees its last `window` positions; blocks before them are not read)."""
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    if meta.is_decode_only:
        if use_triton(q):
            from kernels.decode_attention import paged_decode_attention as kernel

            return kernel(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, order=meta.decode_order,
                          window=window, fresh_keys=meta.num_fresh_keys)  # fmt: skip
        return paged_decode_attention_ref(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, window)
    if use_triton(q):
        from kernels.prefill_attention import paged_prefill_attention as kernel

        return kernel(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, meta.max_query_len, scale,
            window=window,
        )  # fmt: skip
    return paged_prefill_attention_ref(
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale, window
    )
