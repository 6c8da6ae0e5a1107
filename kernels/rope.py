"""Rotary position embedding, NeoX style (Llama, Qwen), applied in place to q and k.

Legend: T = tokens, H = heads, D = head dim (rotary dim == D), P = max positions.
cos_sin_cache is [P, D]: cos in the first D/2 columns, sin in the last D/2 (the
engine builds it, Llama-3 frequency scaling included). For each head:
x1, x2 = x[:D/2], x[D/2:]; x1' = x1 cos - x2 sin; x2' = x2 cos + x1 sin.
fp32 math, one rounding per output. Precision: fp32 within 1e-5, bf16/fp16 one rounding.

Kernel: each program takes BLOCK_T consecutive tokens (1 by default on the GPU, see
rope_tiles), loads their cos/sin rows once and rotates all their q heads, then all
their k heads, as [BLOCK_T, BLOCK_H, D/2] tiles. q and k may be strided views (cut out
of a fused qkv projection): only the head dim must be contiguous.
NOTE: positions are not range-checked on the device (that would need a sync);
the engine guarantees 0 <= position < P.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import (
    TOKEN_TILE_ELEMENTS,
    check_device,
    check_float,
    check_index,
    check_last_dim_contiguous,
    token_tile,
)
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait


@triton.jit
def load_cos_sin(pos_ptr, cache_ptr, t, num_tokens, stride_cache, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """cos, sin [BLOCK_T, 1, BLOCK_HALF] fp32 of tokens t [BLOCK_T] (tokens past num_tokens read position 0)."""
    pos = tl.load(pos_ptr + t, mask=t < num_tokens, other=0).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    row = cache_ptr + pos[:, None] * stride_cache + d[None, :]
    mask = (d < HALF)[None, :]
    cos = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF, mask=mask, other=0.0).to(tl.float32)
    return cos[:, None, :], sin[:, None, :]


@triton.jit
def rotate_tile(x1, x2, cos, sin):
    """NeoX rotation of the halves x1, x2 (any dtype) in fp32: (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rotate_heads_in_place(
    x_ptr,  # [T, H, D]
    t,  # [BLOCK_T] int64 token ids
    num_tokens,
    num_heads,
    stride_t,
    stride_h,
    cos,  # [BLOCK_T, 1, BLOCK_HALF] fp32
    sin,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    d = tl.arange(0, BLOCK_HALF)[None, None, :]
    token_mask = (t < num_tokens)[:, None, None]
    for h0 in range(0, num_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        mask = token_mask & (h < num_heads) & (d < HALF)
        ptr1 = x_ptr + t[:, None, None] * stride_t + h * stride_h + d
        out1, out2 = rotate_tile(tl.load(ptr1, mask=mask), tl.load(ptr1 + HALF, mask=mask), cos, sin)
        tl.store(ptr1, out1.to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(ptr1 + HALF, out2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [T, Hkv, D]
    pos_ptr,  # [T]
    cache_ptr,  # [P, D]: cos | sin
    num_tokens,
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
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # nothing here reads weights before its first dependent load (kernels/_pdl.py)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cos, sin = load_cos_sin(pos_ptr, cache_ptr, t, num_tokens, stride_cache, HALF, BLOCK_HALF)
    rotate_heads_in_place(q_ptr, t, num_tokens, num_q_heads, stride_qt, stride_qh, cos, sin, HALF, BLOCK_HALF, BLOCK_H)
    rotate_heads_in_place(k_ptr, t, num_tokens, num_k_heads, stride_kt, stride_kh, cos, sin, HALF, BLOCK_HALF, BLOCK_H)


def check_rope_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """The checks apply_rope and rope_store_kv share."""
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


def rope_tiles(q: torch.Tensor, k: torch.Tensor, tiles: dict | None) -> dict:
    """HALF, BLOCK_HALF, BLOCK_H (heads per chunk), BLOCK_T (tokens per program) and num_warps."""
    half = q.shape[2] // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(q.shape[1], k.shape[1])), max(1, TOKEN_TILE_ELEMENTS // block_half))
    # NOTE: one token per program on the GPU: the rotation of a token's heads already gives each program
    # 2-5 KB to move, and more tokens a program measured no better (decision 0034).
    config = token_tile(q.shape[0], block_h * block_half, q.device, tiles, max_tokens=1)
    return dict(HALF=half, BLOCK_HALF=block_half, BLOCK_H=block_h, **config)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    tiles: dict | None = None,
) -> None:
    """Rotates q [T, Hq, D] and k [T, Hkv, D] in place at positions [T] with cos_sin_cache [P, D].

    tiles overrides BLOCK_T (tokens per program) or num_warps (benchmark sweeps).
    """
    check_device(_rope_kernel, "q, k, positions and cos_sin_cache", q, k, positions, cos_sin_cache)
    check_rope_args(q, k, positions, cos_sin_cache)
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return
    config = rope_tiles(q, k, tiles)
    _rope_kernel[(triton.cdiv(num_tokens, config["BLOCK_T"]),)](
        q, k, positions, cos_sin_cache,
        num_tokens, q.shape[1], k.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        **config, **pdl_options(q.device),
    )  # fmt: skip


def rope_cos_sin_ref(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, D/2] fp32 at positions [T]."""
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache[positions].float()  # [T, D]
    return cs[:, None, :half], cs[:, None, half:]


def rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated (a new tensor of x's dtype), in fp32."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def apply_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """q: [T, Hq, D], k: [T, Hkv, D], positions: [T]; rotates both in place."""
    cos, sin = rope_cos_sin_ref(positions, cos_sin_cache)
    q.copy_(rotate_ref(q, cos, sin))
    k.copy_(rotate_ref(k, cos, sin))
