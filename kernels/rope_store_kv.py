"""RoPE fused with the KV store: rotate q in place, rotate k on its way into the pool.

Legend: T = new tokens, Hq/Hkv = query/KV heads, D = head dim, N = blocks, B = block
size, P = max positions.
q [T, Hq, D], k and v [T, Hkv, D] (views of a fused qkv projection are fine),
positions [T], cos_sin_cache [P, D] (cos | sin, see kernels/rope.py), k_cache and
v_cache [N, B, Hkv, D], slot_mapping [T] (-1: store nothing for that token).

Math: q <- rope(q) in place; k_cache[slot] <- rope(k); v_cache[slot] <- v. The
rotation is rope.py's (fp32, one rounding), the copy kv_store.py's (exact, or one
cast into the pool's dtype). k itself is NOT written: the attention kernels read
keys from the pool only, so the rotated keys need one home, not two. Precision:
as apply_rope followed by store_kv, which is the reference.

Why fused: at batch 1 each of the two kernels is a fixed ~2.5 us launch-and-latency
cost per layer on an H100 (bench/results/h100/kernels.md, T = 1 rows), and the
unfused pair moves k through memory twice (rotated in place, then copied).

Kernel: each program takes BLOCK_T consecutive tokens: loads their positions,
cos/sin rows and slots once, rotates their q heads in place, then rotates their k
heads and copies their v heads into the pool, as [BLOCK_T, BLOCK_H, D/2] tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device
from kernels.kv_store import check_kv_and_pool, store_kv_ref, token_tile_slots
from kernels.rope import (
    check_rope_args,
    load_cos_sin,
    rope_cos_sin_ref,
    rope_tiles,
    rotate_heads_in_place,
    rotate_ref,
    rotate_tile,
)


@triton.jit
def _rope_store_kv_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [T, Hkv, D]
    v_ptr,  # [T, Hkv, D]
    pos_ptr,  # [T]
    cos_sin_ptr,  # [P, D]
    k_cache_ptr,  # [N, B, Hkv, D]
    v_cache_ptr,  # [N, B, Hkv, D]
    slot_ptr,  # [T]
    num_tokens,
    num_q_heads,
    num_kv_heads,
    block_size,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos_sin,
    stride_cn,  # pool strides (block, offset, head), shared by k_cache and v_cache
    stride_cb,
    stride_ch,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    t, keep, cache_row = token_tile_slots(slot_ptr, num_tokens, block_size, stride_cn, stride_cb, BLOCK_T)
    cos, sin = load_cos_sin(pos_ptr, cos_sin_ptr, t, num_tokens, stride_cos_sin, HALF, BLOCK_HALF)
    rotate_heads_in_place(q_ptr, t, num_tokens, num_q_heads, stride_qt, stride_qh, cos, sin, HALF, BLOCK_HALF, BLOCK_H)

    d = tl.arange(0, BLOCK_HALF)[None, None, :]
    tok = t[:, None, None]
    for h0 in range(0, num_kv_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        mask = keep & (h < num_kv_heads) & (d < HALF)
        k1_ptr = k_ptr + tok * stride_kt + h * stride_kh + d
        v1_ptr = v_ptr + tok * stride_vt + h * stride_vh + d
        k1, k2 = tl.load(k1_ptr, mask=mask), tl.load(k1_ptr + HALF, mask=mask)
        v1, v2 = tl.load(v1_ptr, mask=mask), tl.load(v1_ptr + HALF, mask=mask)
        out1, out2 = rotate_tile(k1, k2, cos, sin)
        # NOTE: rounded to k's dtype first, as the unfused pair (rope in place, then a copy) rounds
        out1 = out1.to(k_ptr.dtype.element_ty)
        out2 = out2.to(k_ptr.dtype.element_ty)
        cache_off = cache_row + h * stride_ch + d
        tl.store(k_cache_ptr + cache_off, out1.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(k_cache_ptr + cache_off + HALF, out2.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + cache_off, v1.to(v_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + cache_off + HALF, v2.to(v_cache_ptr.dtype.element_ty), mask=mask)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    tiles: dict | None = None,
) -> None:
    """Rotates q in place and writes rope(k) and v into the pool at slot_mapping; k is left as it was.

    tiles overrides BLOCK_T (tokens per program) or num_warps (benchmark sweeps).
    """
    check_device(_rope_store_kv_kernel, "q, k, v, positions, cos_sin_cache, k_cache, v_cache and slot_mapping",
                 q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping)  # fmt: skip
    check_rope_args(q, k, positions, cos_sin_cache)
    check_kv_and_pool(k, v, k_cache, v_cache, slot_mapping)
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return
    config = rope_tiles(q, k, tiles)
    _rope_store_kv_kernel[(triton.cdiv(num_tokens, config["BLOCK_T"]),)](
        q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
        num_tokens, q.shape[1], k.shape[1], k_cache.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin_cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        **config,
    )  # fmt: skip


def rope_store_kv_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """apply_rope_ref's rotation of q (in place) and of k (into a new tensor: k is left as it was,
    like the kernel), then store_kv_ref."""
    cos, sin = rope_cos_sin_ref(positions, cos_sin_cache)
    q.copy_(rotate_ref(q, cos, sin))
    store_kv_ref(rotate_ref(k, cos, sin), v, k_cache, v_cache, slot_mapping)
