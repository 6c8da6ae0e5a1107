"""RoPE fused with the KV store: rotate q in place, rotate k on its way into the pool;
optionally with Qwen3's per-head RMSNorm of q and k before the rotation.

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
With qk_norm = (q_weight [D], k_weight [D], eps), each head x of q and k is first
rms_norm.py's RMSNorm over D (fp32, rounded once to x's dtype, as the unfused norm
stores it), then rotated: q <- rope(rmsnorm(q)), k_cache[slot] <- rope(rmsnorm(k)).
Precision: as rms_norm_ref then rope_store_kv_ref, within one rounding of the dtype
(the sum of squares is taken in another order than the norm kernel's).

Why fused: at batch 1 each of the two kernels is a fixed launch-and-latency cost per layer, and the
unfused pair moves k through memory twice (rotated in place, then copied) (decision 0013). Qwen3's
q and k norms were two more such kernels per layer, each writing a new copy of q or k.

Kernel: each program takes BLOCK_T consecutive tokens: loads their positions,
cos/sin rows and slots once, rotates their q heads in place, then rotates their k
heads and copies their v heads into the pool, as [BLOCK_T, BLOCK_H, D/2] tiles of q
and [BLOCK_T, BLOCK_HK, D/2] tiles of k and v (BLOCK_HK: k's head count, not q's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.kv_store import check_kv_and_pool, store_kv_ref, token_tile_slots
from kernels.rms_norm import rms_norm_ref
from kernels.rope import (
    check_rope_args,
    load_cos_sin,
    rope_cos_sin_ref,
    rope_tiles,
    rotate_ref,
    rotate_tile,
)


@triton.jit
def _head_rms_norm(x1, x2, w_ptr, eps, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """RMSNorm over each head's D = 2 HALF values, given as halves x1, x2 [BLOCK_T, BLOCK_H,
    BLOCK_HALF] (masked lanes 0), times w [D]; fp32 in, fp32 out (the caller rounds)."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    mean_square = (tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / (2 * HALF)
    rstd = tl.rsqrt(mean_square + eps)[:, :, None]
    d = tl.arange(0, BLOCK_HALF)
    w1 = tl.load(w_ptr + d, mask=d < HALF, other=0.0).to(tl.float32)[None, None, :]
    w2 = tl.load(w_ptr + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)[None, None, :]
    return x1 * rstd * w1, x2 * rstd * w2


@triton.jit
def _load_head_halves(ptr, mask, w_ptr, eps, HAS_QK_NORM: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """The two halves of each head at ptr, normalized (and rounded to the tensor's dtype, as the
    unfused norm would store them) when HAS_QK_NORM."""
    x1 = tl.load(ptr, mask=mask, other=0.0)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0)
    if HAS_QK_NORM:
        n1, n2 = _head_rms_norm(x1, x2, w_ptr, eps, HALF, BLOCK_HALF)
        x1 = n1.to(ptr.dtype.element_ty)
        x2 = n2.to(ptr.dtype.element_ty)
    return x1, x2


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
    q_norm_ptr,  # [D] (read only when HAS_QK_NORM)
    k_norm_ptr,  # [D]
    norm_eps,
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
    BLOCK_HK: tl.constexpr,  # k and v heads per chunk
    BLOCK_T: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    # Before the wait (kernels/_pdl.py): the tokens' slots and positions, staged before the step's first
    # kernel, and their cos/sin rows, a table no kernel writes; q, k and v come from the kernel before.
    t, keep, cache_row = token_tile_slots(slot_ptr, num_tokens, block_size, stride_cn, stride_cb, BLOCK_T)
    cos, sin = load_cos_sin(pos_ptr, cos_sin_ptr, t, num_tokens, stride_cos_sin, HALF, BLOCK_HALF)
    pdl_wait(PDL)
    d = tl.arange(0, BLOCK_HALF)[None, None, :]
    tok = t[:, None, None]
    # q in place: rope.py's rotate_heads_in_place, with the heads normalized on load when HAS_QK_NORM
    for h0 in range(0, num_q_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        mask = (tok < num_tokens) & (h < num_q_heads) & (d < HALF)
        q1_ptr = q_ptr + tok * stride_qt + h * stride_qh + d
        q1, q2 = _load_head_halves(q1_ptr, mask, q_norm_ptr, norm_eps, HAS_QK_NORM, HALF, BLOCK_HALF)
        out1, out2 = rotate_tile(q1, q2, cos, sin)
        tl.store(q1_ptr, out1.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(q1_ptr + HALF, out2.to(q_ptr.dtype.element_ty), mask=mask)

    for h0 in range(0, num_kv_heads, BLOCK_HK):
        h = (h0 + tl.arange(0, BLOCK_HK))[None, :, None]
        mask = keep & (h < num_kv_heads) & (d < HALF)
        k1_ptr = k_ptr + tok * stride_kt + h * stride_kh + d
        v1_ptr = v_ptr + tok * stride_vt + h * stride_vh + d
        k1, k2 = _load_head_halves(k1_ptr, mask, k_norm_ptr, norm_eps, HAS_QK_NORM, HALF, BLOCK_HALF)
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
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    tiles: dict | None = None,
) -> None:
    """Rotates q in place and writes rope(k) and v into the pool at slot_mapping; k is left as it was.

    qk_norm: (q_weight [D], k_weight [D], eps) to RMSNorm each head of q and k first (Qwen3).
    tiles overrides BLOCK_T (tokens per program) or num_warps (benchmark sweeps).
    """
    check_device(_rope_store_kv_kernel, "q, k, v, positions, cos_sin_cache, k_cache, v_cache and slot_mapping",
                 q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping)  # fmt: skip
    check_rope_args(q, k, positions, cos_sin_cache)
    check_kv_and_pool(k, v, k_cache, v_cache, slot_mapping)
    if qk_norm is not None:
        check_qk_norm(q, qk_norm)
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return
    config = rope_tiles(q, k, tiles)
    # NOTE: k and v take chunks of their own heads' width, not q's (4 lanes, not 16, at GQA 4): fewer registers
    # and more of the copy bandwidth here; RoPE alone measured slower with it, so rope.py keeps q's width for k
    # (decision 0034).
    block_hk = min(triton.next_power_of_2(k.shape[1]), config["BLOCK_H"])
    q_norm, k_norm, eps = qk_norm if qk_norm is not None else (q, q, 0.0)
    _rope_store_kv_kernel[(triton.cdiv(num_tokens, config["BLOCK_T"]),)](
        q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, q_norm, k_norm, float(eps),
        num_tokens, q.shape[1], k.shape[1], k_cache.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin_cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HAS_QK_NORM=qk_norm is not None, BLOCK_HK=block_hk,
        **config, **pdl_options(q.device),
    )  # fmt: skip


def check_qk_norm(q: torch.Tensor, qk_norm: tuple[torch.Tensor, torch.Tensor, float]) -> None:
    q_weight, k_weight, _ = qk_norm
    for name, weight in (("q norm weight", q_weight), ("k norm weight", k_weight)):
        check_float(name, weight)
        if weight.shape != (q.shape[2],) or not weight.is_contiguous() or weight.device != q.device:
            raise ValueError(
                f"the {name} must be a contiguous [D={q.shape[2]}] tensor on {q.device}, "
                f"got {tuple(weight.shape)} on {weight.device}"
            )


def rope_store_kv_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> None:
    """rms_norm_ref of each head of q and k when qk_norm is given, then apply_rope_ref's rotation of
    q (in place) and of k (into a new tensor: k is left as it was, like the kernel), then store_kv_ref."""
    cos, sin = rope_cos_sin_ref(positions, cos_sin_cache)
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        q_in, k_in = rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps)
    else:
        q_in, k_in = q, k
    q.copy_(rotate_ref(q_in, cos, sin))
    store_kv_ref(rotate_ref(k_in, cos, sin), v, k_cache, v_cache, slot_mapping)
