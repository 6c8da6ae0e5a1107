"""The one-token qkv projection with its pre-norm, RoPE and KV store in one kernel: what
kernels/rms_norm_gemv.py and kernels/rope_store_kv.py do at batch-1 decode, one kernel a layer
fewer (Llama-family attention without q/k norms).

Legend: K = hidden size, Hq / Hkv = query / KV heads, D = head dim (even), HALF = D / 2,
N = (Hq + 2 Hkv) D, the qkv weight's rows (q heads, then k heads, then v heads). B = block size.
    h = x + residual (rounded to x's dtype; h = x without a residual), rstd as in rms_norm_gemv.py
    y = (h * rstd * g) W^T (+ bias)                                   [1, N] in fp32
    qkv[q rows] = rope(y[q rows]); qkv[k rows] = y[k rows]; qkv[v rows] = y[v rows]  (x's dtype)
    k_cache[slot] = rope(y[k rows]); v_cache[slot] = y[v rows]       (nothing stored at slot -1)
rope is kernels/rope.py's NeoX rotation at the token's position: (a cos - b sin, b cos + a sin) of
each head's halves a = y[:HALF], b = y[HALF:]. So qkv and the pool hold what the unfused pair leaves
(rope_store_kv rotates q in place, stores rope(k) and v, and leaves k as projected).

Precision contract: rms_norm_gemv_ref then rope_store_kv_ref within one rounding of the dtype: the
unfused pair rounds y to the dtype before it rotates; this kernel rotates y in fp32 and rounds once.

Why: at one token RoPE + KV store is a kernel of its own whose time is nearly all launch and latency, and
the rotation only needs, for each output row, its partner HALF rows away (decision 0017).

Kernel: as rms_norm_gemv.py with SwiGLU's two row sets, but a program's row sets are BLOCK_N rows
of one head's first half and their partners HALF rows below, so that each program holds whole
rotation pairs: program p takes head p // (HALF / BLOCK_N). The epilogue rotates q and k heads with
the token's cos/sin row, writes every row of qkv, and the k and v heads into the token's pool slot.
Qwen3's per-head q/k RMSNorm needs a whole head in one program and keeps the unfused pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, num_sms
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.gemv import few_programs_per_sm
from kernels.kv_store import check_kv_and_pool
from kernels.rms_norm_gemv import check_norm_gemv_args, normed_chunk, rms_norm_gemv_ref
from kernels.rope import check_rope_args
from kernels.rope_store_kv import rope_store_kv_ref

# 4 rows of a head's first half and their 4 partners a program: the 8 rows a program of
# rms_norm_gemv.py's default tile streams, so both launch as many programs for a qkv weight.
TILES = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4}
# Where the grid has few programs an SM at TILES (kernels/gemv.py's few_programs_per_sm, its rule for
# its wide step: Llama-3.2-1B's 384 programs, Qwen2-0.5B's 144), 1024-column chunks: half of the weights
# then load before the PDL wait and the K loop is half as long, which a program that has an SM nearly to
# itself needs to cover DRAM latency. On 2 + 2 rows and 4 warps: twice the programs, 32 weights a thread a
# chunk. Many-program grids (the 8B's) keep TILES, where the wide tile was slower (decision 0017).
WIDE_TILES = {"BLOCK_N": 2, "BLOCK_K": 1024, "num_warps": 4}
TILE_KEYS = tuple(TILES)


@triton.jit
def _rms_norm_qkv_rope_kernel(
    x_ptr,  # [1, K] the layer's input before the norm
    res_ptr,  # [1, K] the residual stream (read only when HAS_RESIDUAL)
    norm_w_ptr,  # [K] the RMSNorm weight g
    w_ptr,  # [N, K] the qkv weight: Hq heads, Hkv heads, Hkv heads of D rows
    bias_ptr,  # [N] (read only when HAS_BIAS)
    qkv_ptr,  # [1, N] out
    new_res_ptr,  # [1, K] h = x + residual (written by program 0 only when HAS_RESIDUAL)
    pos_ptr,  # [1] the token's position
    cos_sin_ptr,  # [P, D] cos | sin (kernels/rope.py)
    slot_ptr,  # [1] the token's pool slot (-1: store nothing)
    k_cache_ptr,  # [N_blocks, B, Hkv, D]
    v_cache_ptr,  # [N_blocks, B, Hkv, D]
    K,
    stride_wn,
    eps,
    num_q_heads,
    num_kv_heads,
    block_size,
    stride_cos_sin,
    stride_cn,  # pool strides (block, offset, head), shared by k_cache and v_cache
    stride_cb,
    stride_ch,
    HALF: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    head = pid // (HALF // BLOCK_N)
    j = (pid % (HALF // BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)  # offsets in the head's first half
    n = head * 2 * HALF + j  # first-half rows; their partners are n + HALF
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    up_rows = w_rows + HALF * stride_wn  # the partner rows (named as rms_norm_gemv.py's second row set)
    # The first chunk of weights is loaded before the wait for the kernel before (kernels/_pdl.py).
    k = tl.arange(0, BLOCK_K)
    k_mask = k < K
    w = tl.load(w_rows + k[None, :], mask=k_mask[None, :], other=0.0)
    w_up = tl.load(up_rows + k[None, :], mask=k_mask[None, :], other=0.0)
    # So are the token's position and slot, the step's metadata (staged before its first kernel).
    pos = tl.load(pos_ptr).to(tl.int64)
    slot = tl.load(slot_ptr).to(tl.int64)
    pdl_wait(PDL)
    # NOTE: the cos/sin row is issued here, in flight during the loop, and not before the wait: it waits
    # for the position, and a chain of loads there stalls a program that starts late (decision 0017)
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + j).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + HALF + j).to(tl.float32)
    hg, sum_sq = normed_chunk(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, k, k_mask, pid, HAS_RESIDUAL)
    acc = w.to(tl.float32) * hg[None, :]
    acc_up = w_up.to(tl.float32) * hg[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        hg, chunk_sq = normed_chunk(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, k, k_mask, pid, HAS_RESIDUAL)
        sum_sq += chunk_sq
        w = tl.load(w_rows + k[None, :], mask=k_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * hg[None, :]
        w_up = tl.load(up_rows + k[None, :], mask=k_mask[None, :], other=0.0)
        acc_up += w_up.to(tl.float32) * hg[None, :]
    rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / K + eps)
    a = tl.sum(acc, axis=1) * rstd  # the head's first-half rows
    b = tl.sum(acc_up, axis=1) * rstd  # their partners
    if HAS_BIAS:
        a += tl.load(bias_ptr + n).to(tl.float32)
        b += tl.load(bias_ptr + n + HALF).to(tl.float32)

    rotated_a = (a * cos - b * sin).to(qkv_ptr.dtype.element_ty)
    rotated_b = (b * cos + a * sin).to(qkv_ptr.dtype.element_ty)
    a = a.to(qkv_ptr.dtype.element_ty)
    b = b.to(qkv_ptr.dtype.element_ty)
    is_q = head < num_q_heads
    tl.store(qkv_ptr + n, tl.where(is_q, rotated_a, a))
    tl.store(qkv_ptr + n + HALF, tl.where(is_q, rotated_b, b))

    # the pool: k heads rotated, v heads as projected
    is_k = (head >= num_q_heads) & (head < num_q_heads + num_kv_heads)
    is_v = head >= num_q_heads + num_kv_heads
    kv_head = tl.where(is_k, head - num_q_heads, head - num_q_heads - num_kv_heads)
    cache_off = (slot // block_size) * stride_cn + (slot % block_size) * stride_cb + kv_head * stride_ch + j
    store_k = (slot >= 0) & is_k
    store_v = (slot >= 0) & is_v
    k_dtype = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + cache_off, rotated_a.to(k_dtype), mask=store_k & (j >= 0))
    tl.store(k_cache_ptr + cache_off + HALF, rotated_b.to(k_dtype), mask=store_k & (j >= 0))
    tl.store(v_cache_ptr + cache_off, a.to(v_cache_ptr.dtype.element_ty), mask=store_v & (j >= 0))
    tl.store(v_cache_ptr + cache_off + HALF, b.to(v_cache_ptr.dtype.element_ty), mask=store_v & (j >= 0))


def _heads(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """q [1, Hq, D], k and v [1, Hkv, D]: views of a qkv row."""
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    return q.view(1, num_q_heads, head_dim), k.view(1, num_kv_heads, head_dim), v.view(1, num_kv_heads, head_dim)


def qkv_rope_block_n(head_dim: int, tiles: dict | None = None) -> int:
    """Rows of a head's first half a program takes: the tile's BLOCK_N, halved until it divides D / 2."""
    block_n = (tiles or {}).get("BLOCK_N", TILES["BLOCK_N"])
    while (head_dim // 2) % block_n:
        block_n //= 2
    return block_n


def qkv_rope_tiles(num_heads: int, head_dim: int, sms: int) -> dict:
    """The tile for num_heads (q, k and v heads) of head_dim on a GPU of `sms` SMs (0: the
    interpreter, which keeps TILES): WIDE_TILES where its grid has few programs an SM."""
    programs = num_heads * (head_dim // 2 // qkv_rope_block_n(head_dim))
    return dict(WIDE_TILES if few_programs_per_sm(programs, sms) else TILES)


def rms_norm_qkv_rope(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
    *,
    tiles: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(qkv [1, N] with q rotated, h = x + residual [1, K]); rope(k) and v written into the pool at
    slot_mapping[0]. The pool k_cache, v_cache [N_blocks, B, Hkv, D] gives Hkv and D.

    tiles overrides BLOCK_N, BLOCK_K or num_warps of the tile qkv_rope_tiles picks (tests, sweeps).
    """
    check_norm_gemv_args(x, residual, norm_weight, weight, bias)
    check_device(_rms_norm_qkv_rope_kernel, "x, positions, cos_sin_cache, k_cache, v_cache and slot_mapping",
                 x, positions, cos_sin_cache, k_cache, v_cache, slot_mapping)  # fmt: skip
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if head_dim % 2:
        raise ValueError(f"the head dim must be even (RoPE rotates halves), got {head_dim}")
    if weight.shape[0] != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(
            f"weight has {weight.shape[0]} rows; q, k and v heads need (Hq {num_q_heads} + 2 Hkv {num_kv_heads})"
            f" x D {head_dim} = {(num_q_heads + 2 * num_kv_heads) * head_dim}"
        )
    qkv = torch.empty(1, weight.shape[0], device=x.device, dtype=x.dtype)
    q, k, v = _heads(qkv, num_q_heads, num_kv_heads, head_dim)
    check_rope_args(q, k, positions, cos_sin_cache)
    check_kv_and_pool(k, v, k_cache, v_cache, slot_mapping)
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    num_heads = num_q_heads + 2 * num_kv_heads
    config = {**qkv_rope_tiles(num_heads, head_dim, num_sms(x.device)), **(tiles or {})}
    config["BLOCK_N"] = qkv_rope_block_n(head_dim, config)
    new_residual = torch.empty_like(x) if residual is not None else x
    _rms_norm_qkv_rope_kernel[(num_heads * (head_dim // 2 // config["BLOCK_N"]),)](
        x, residual if residual is not None else x, norm_weight, weight, bias if bias is not None else weight,
        qkv, new_residual, positions, cos_sin_cache, slot_mapping, k_cache, v_cache,
        x.shape[1], weight.stride(0), float(eps), num_q_heads, num_kv_heads, k_cache.shape[1],
        cos_sin_cache.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HALF=head_dim // 2, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
        **config, **pdl_options(x.device),
    )  # fmt: skip
    return qkv, new_residual


def rms_norm_qkv_rope_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused pair: rms_norm_gemv_ref, then rope_store_kv_ref on the q, k, v views of its output."""
    qkv, new_residual = rms_norm_gemv_ref(x, residual, norm_weight, eps, weight, bias)
    q, k, v = _heads(qkv, num_q_heads, k_cache.shape[2], k_cache.shape[3])
    rope_store_kv_ref(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping)
    return qkv, new_residual
