"""Rotary position embedding, NeoX style (Llama, Qwen), applied in place to q and k.

Legend: T = tokens, H = heads, D = head dim (rotary dim == D), P = max positions.
cos_sin_cache is [P, D]: cos in the first D/2 columns, sin in the last D/2 (the
engine builds it, Llama-3 frequency scaling included). For each head:
x1, x2 = x[:D/2], x[D/2:]; x1' = x1 cos - x2 sin; x2' = x2 cos + x1 sin.
fp32 math, one rounding per output. Precision: fp32 within 1e-5, bf16/fp16 one rounding.

Kernel: one program per token loads its cos/sin row once and rotates all q heads,
then all k heads, BLOCK_H heads at a time. q and k may be strided views (cut out
of a fused qkv projection): only the head dim must be contiguous.
NOTE: positions are not range-checked on the device (that would need a sync);
the engine guarantees 0 <= position < P.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, check_index, check_last_dim_contiguous, warps_for


@triton.jit
def _rotate_heads(
    base_ptr,  # this token's row of q or k
    num_heads,
    stride_h,
    cos,  # [BLOCK_HALF] fp32
    sin,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    d = tl.arange(0, BLOCK_HALF)
    for h0 in range(0, num_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = (h < num_heads)[:, None] & (d < HALF)[None, :]
        ptr1 = base_ptr + h[:, None] * stride_h + d[None, :]
        x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0).to(tl.float32)
        out1 = x1 * cos[None, :] - x2 * sin[None, :]
        out2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(ptr1, out1.to(base_ptr.dtype.element_ty), mask=mask)
        tl.store(ptr1 + HALF, out2.to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [T, Hkv, D]
    pos_ptr,  # [T]
    cache_ptr,  # [P, D]: cos | sin
    num_q_heads,
    num_k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + d, mask=d < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + t * stride_qt, num_q_heads, stride_qh, cos, sin, HALF, BLOCK_HALF, BLOCK_H)
    _rotate_heads(k_ptr + t * stride_kt, num_k_heads, stride_kh, cos, sin, HALF, BLOCK_HALF, BLOCK_H)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Rotates q [T, Hq, D] and k [T, Hkv, D] in place at positions [T] with cos_sin_cache [P, D]."""
    check_device(_rope_kernel, "q, k, positions and cos_sin_cache", q, k, positions, cos_sin_cache)
    check_float("q", q)
    check_float("cos_sin_cache", cos_sin_cache)
    check_index("positions", positions, 1)
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [T, H, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    num_tokens, _, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or k.dtype != q.dtype:
        raise ValueError(f"k {tuple(k.shape)} {k.dtype} must match q {tuple(q.shape)} {q.dtype} in T, D and dtype")
    if positions.shape[0] != num_tokens:
        raise ValueError(f"positions must have {num_tokens} entries (one per token), got {positions.shape[0]}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim or head_dim % 2:
        raise ValueError(
            f"cos_sin_cache must be [P, D={head_dim}] with D even (rotary dim == head dim), "
            f"got {tuple(cos_sin_cache.shape)}"
        )
    check_last_dim_contiguous("q", q)
    check_last_dim_contiguous("k", k)
    check_last_dim_contiguous("cos_sin_cache", cos_sin_cache)
    if num_tokens == 0:
        return
    half = head_dim // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(q.shape[1], k.shape[1])), max(1, 4096 // block_half))
    _rope_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache,
        q.shape[1], k.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        HALF=half, BLOCK_HALF=block_half, BLOCK_H=block_h, num_warps=warps_for(block_h * block_half),
    )  # fmt: skip


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def apply_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """q: [T, Hq, D], k: [T, Hkv, D], positions: [T]; rotates both in place."""
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache[positions].float()  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]  # [T, 1, D/2]
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))
