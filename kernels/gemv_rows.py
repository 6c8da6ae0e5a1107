"""The one-token projections of kernels/gemv.py and kernels/rms_norm_gemv.py for a few token rows (2..MAX_ROWS):
each weight tile is read once and multiplied into every row.

Legend: M = token rows, K = input features, N = output rows of the weight, I = N / 2 (SwiGLU).
    gemv_rows(x [M, K], w [N, K], bias [N] | None) -> y [M, N] = x w^T (+ bias)
    rms_norm_gemv_rows(x [M, K], residual [M, K] | None, g [K], eps, w [N, K], bias) -> (y, h [M, K]), per row as
        kernels/rms_norm_gemv.py: h = x + residual rounded to x's dtype, rstd = 1 / sqrt(mean(h^2) + eps),
        y = rstd * (h * g) W^T (+ bias) [M, N]; SwiGLU (W = [W_gate; W_up]): silu(y[:, :I]) * y[:, I:] [M, I]
Math: fp32 products and sums, one rounding of y to x's dtype (stored as y's dtype: the LM head's fp32 logits).
Precision contract: the fp32 references (gemv_ref, rms_norm_gemv_ref) row by row, within the summation-order
tolerance and one rounding of the output, as the one-token kernels.

Why: a decode step of a few sequences at a small model's shape otherwise takes cuBLAS GEMMs and separate norm and
SwiGLU kernels, each launch-bound, the cuBLAS ones breaking the PDL chain (kernels/_pdl.py). These kernels give a
few rows the one-token step's kernel sequence and PDL chain. engine/ops.py takes them up to 4 rows and for small
weights only: on an H200, large weights ran slower than on cuBLAS, and 8 rows gained nothing in the engine
(decision 0071).

Kernel: each program owns BLOCK_N weight rows and walks K in BLOCK_K chunks as kernels/gemv.py does, but
accumulates a [ROWS, BLOCK_N, BLOCK_K] fp32 tile, the chunk's weights times every token row's inputs (ROWS: M
rounded up to a power of two, the rows past M masked off), and reduces it once at the end. Both the inputs and
the weights are loaded in that tile's layout, each token row's threads loading the same weight addresses (L1 hits;
kernels/gemv.py's x_tile does the same for x): a [BLOCK_N, BLOCK_K] weight tile broadcast over the token rows
would go through shared memory, two barriers a chunk. The next chunk's weights are in flight while a chunk is
multiplied. The norm's sum of squares is reduced chunk by chunk ([ROWS, BLOCK_N]: registers); every program reads
all of each row's h, and program 0 writes the new residual.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.gemv import check_projection_args, gemv_ref
from kernels.rms_norm_gemv import check_norm_gemv_args, rms_norm_gemv_ref

MAX_ROWS = 8  # the kernels' limit; the engine's is engine/ops.py's GEMV_ROWS_MAX
# Tiles by kind and token rows (ROWS), the fastest of bench/gemv_rows.py's sweep at the SmolLM2-135M and
# Qwen2.5-0.5B shapes on an H200 on 2026-11-29 (decision 0071). A plain projection: one weight row and 512 columns a
# program at every row count. A norm before it: fewer columns and more rows a program as the token rows grow,
# whose tiles of products hold a thread's registers.
PLAIN_TILES = {rows: {"BLOCK_N": 1, "BLOCK_K": 512, "num_warps": 4} for rows in (1, 2, 4, 8)}
NORM_TILES = {
    1: {"BLOCK_N": 1, "BLOCK_K": 512, "num_warps": 4},
    2: {"BLOCK_N": 1, "BLOCK_K": 512, "num_warps": 4},
    4: {"BLOCK_N": 2, "BLOCK_K": 256, "num_warps": 8},
    8: {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 8},
}
SWIGLU_TILES = {
    1: {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 8},
    2: {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 8},
    4: {"BLOCK_N": 4, "BLOCK_K": 128, "num_warps": 4},
    8: {"BLOCK_N": 2, "BLOCK_K": 128, "num_warps": 4},
}
TILES = PLAIN_TILES[8]  # the keys a caller's tiles may set; the GPU tile the tests also run on a CPU
# Triton's CPU interpreter runs the programs one after another, each a few numpy operations on whole tiles:
# there few wide programs are fast (an LM head of 49152 rows is 49152 programs at the plain tile, 768 at these).
INTERPRETER_TILES = {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4}
TILE_KEYS = tuple(TILES)


@triton.jit
def rows_tile(x_ptr, stride_xm, r, r_mask, n, k, k_mask):
    """x[r, k] of every token row as a [ROWS, BLOCK_N, BLOCK_K] tile in the weight tile's layout, fp32
    (0 past K and in the rows past M)."""
    ptrs = x_ptr + r[:, None, None] * stride_xm + k[None, None, :] + 0 * n[None, :, None]
    return tl.load(ptrs, mask=r_mask[:, None, None] & k_mask[None, None, :], other=0.0).to(tl.float32)


@triton.jit
def weight_rows_chunk(w_rows, n_mask, k0, K, BLOCK_K: tl.constexpr):
    """Columns k0 .. k0 + BLOCK_K of the weight rows (w_rows: [ROWS, BLOCK_N, 1] row pointers, the same row in
    every token row), as a [ROWS, BLOCK_N, BLOCK_K] tile in the products' layout; 0 past K and in masked-off rows.

    Why each token row loads the weights itself: a [BLOCK_N, BLOCK_K] tile broadcast over the token rows is moved
    into their layout through shared memory, two barriers a chunk; the repeated loads are L1 hits."""
    k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_rows + k[None, None, :], mask=n_mask[None, :, None] & (k < K)[None, None, :], other=0.0)


@triton.jit
def _gemv_rows_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] (read only when HAS_BIAS)
    y_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    r = tl.arange(0, ROWS)
    w_rows = w_ptr + n[None, :, None].to(tl.int64) * stride_wn + 0 * r[:, None, None]  # [ROWS, BLOCK_N, 1]
    # the first chunk of weights streams before the wait, while the kernel before finishes (kernels/_pdl.py)
    k = tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + k[None, None, :], mask=n_mask[None, :, None] & (k < K)[None, None, :], other=0.0)
    pdl_wait(PDL)
    r_mask = r < M
    acc = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w_next = weight_rows_chunk(w_rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)  # in flight during the products
        k = k0 + tl.arange(0, BLOCK_K)
        acc += w.to(tl.float32) * rows_tile(x_ptr, stride_xm, r, r_mask, n, k, k < K)
        w = w_next
    y = tl.sum(acc, axis=2)  # [ROWS, BLOCK_N]
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    # NOTE: rounded to x's dtype first, as F.linear rounds, also where y is wider (fp32 logits)
    out = y.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + r[:, None] * stride_ym + n[None, :], out, mask=r_mask[:, None] & n_mask[None, :])


@triton.jit
def normed_rows_tile(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, stride_xm, r, r_mask, n, writes, k, k_mask,
                     HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """One chunk of every row's norm input in the weight tile's layout: (h * g, h * h) in fp32, h = x
    (+ residual, rounded to the activation dtype and written where `writes`: one lane of program 0).
    x, residual and the new residual share the row stride stride_xm."""
    h = rows_tile(x_ptr, stride_xm, r, r_mask, n, k, k_mask)
    if HAS_RESIDUAL:
        # NOTE: the sum is rounded to the activation dtype before it is normalized, as the unfused model
        # stores it (and kernels/rms_norm.py's fused add does).
        summed = (h + rows_tile(res_ptr, stride_xm, r, r_mask, n, k, k_mask)).to(new_res_ptr.dtype.element_ty)
        at = new_res_ptr + r[:, None, None] * stride_xm + k[None, None, :] + 0 * n[None, :, None]
        tl.store(at, summed, mask=r_mask[:, None, None] & k_mask[None, None, :] & writes[None, :, None])
        h = summed.to(tl.float32)
    g = rows_tile(norm_w_ptr, 0, r, r_mask, n, k, k_mask)  # g in every token row's place (row stride 0)
    return h * g, h * h


@triton.jit
def _rms_norm_gemv_rows_kernel(
    x_ptr,  # [M, K] the layer's input before the norm
    res_ptr,  # [M, K] the residual stream (read only when HAS_RESIDUAL)
    norm_w_ptr,  # [K] the RMSNorm weight g
    w_ptr,  # [N, K] (SwiGLU: [2I, K], gate rows then up rows)
    bias_ptr,  # [N] (read only when HAS_BIAS)
    y_ptr,  # [M, N] (SwiGLU: [M, I])
    new_res_ptr,  # [M, K] h = x + residual (written by program 0 only when HAS_RESIDUAL)
    M,
    num_rows,  # N (SwiGLU: I), the output rows
    K,
    stride_xm,  # of x, residual and the new residual
    stride_wn,
    stride_ym,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SWIGLU: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < num_rows
    r = tl.arange(0, ROWS)
    w_rows = w_ptr + n[None, :, None].to(tl.int64) * stride_wn + 0 * r[:, None, None]  # [ROWS, BLOCK_N, 1]
    if SWIGLU:
        up_rows = w_ptr + (n[None, :, None] + num_rows).to(tl.int64) * stride_wn + 0 * r[:, None, None]
    k = tl.arange(0, BLOCK_K)
    wk_mask = n_mask[None, :, None] & (k < K)[None, None, :]
    w = tl.load(w_rows + k[None, None, :], mask=wk_mask, other=0.0)  # the first chunk, before the wait
    if SWIGLU:
        w_up = tl.load(up_rows + k[None, None, :], mask=wk_mask, other=0.0)
    pdl_wait(PDL)
    r_mask = r < M
    writes = (tl.arange(0, BLOCK_N) == 0) & (pid == 0)  # the lane that stores the new residual
    acc = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)  # gate rows under SwiGLU
    sum_sq = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)  # each chunk's squares reduced at once: registers
    if SWIGLU:
        acc_up = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w_next = weight_rows_chunk(w_rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)  # in flight during the products
        if SWIGLU:
            w_up_next = weight_rows_chunk(up_rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)
        k = k0 + tl.arange(0, BLOCK_K)
        hg, squares = normed_rows_tile(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, stride_xm, r, r_mask, n, writes,
                                       k, k < K, HAS_RESIDUAL)  # fmt: skip
        sum_sq += tl.sum(squares, axis=2)
        acc += w.to(tl.float32) * hg
        w = w_next
        if SWIGLU:
            acc_up += w_up.to(tl.float32) * hg
            w_up = w_up_next
    # every weight row's lane summed the same squares: rstd [ROWS, BLOCK_N] is a row's rstd in each column
    rstd = tl.rsqrt(sum_sq / K + eps)
    y = tl.sum(acc, axis=2) * rstd
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if SWIGLU:
        up = tl.sum(acc_up, axis=2) * rstd
        if HAS_BIAS:
            up += tl.load(bias_ptr + num_rows + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y = y / (1.0 + tl.exp(-y)) * up
    out = y_ptr + r[:, None] * stride_ym + n[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=r_mask[:, None] & n_mask[None, :])


def _tiles(x: torch.Tensor, by_rows: dict, tiles: dict | None) -> dict:
    """The tile of by_rows for x's rows (INTERPRETER_TILES off a GPU), with the caller's tiles over it."""
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    chosen = by_rows[triton.next_power_of_2(x.shape[0])] if x.device.type == "cuda" else INTERPRETER_TILES
    return {**chosen, **(tiles or {})}


def _check_rows(x: torch.Tensor) -> int:
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must be [M, K] with 1 <= M <= {MAX_ROWS} token rows, got {tuple(x.shape)}")
    return triton.next_power_of_2(x.shape[0])


def gemv_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    tiles: dict | None = None,
) -> torch.Tensor:
    """y [M, N] = x [M, K] weight[N, K]^T (+ bias), rounded to x's dtype and stored as out_dtype (default x's).
    tiles overrides BLOCK_N, BLOCK_K or num_warps (tests, sweeps)."""
    check_device(_gemv_rows_kernel, "x, weight and bias", x, weight, *([bias] if bias is not None else []))
    rows = _check_rows(x)
    num_out, num_in = check_projection_args(x, weight, bias, out_dtype)
    config = _tiles(x, PLAIN_TILES, tiles)
    y = torch.empty(x.shape[0], num_out, device=x.device, dtype=out_dtype or x.dtype)
    _gemv_rows_kernel[(triton.cdiv(num_out, config["BLOCK_N"]),)](
        x, weight, bias if bias is not None else weight, y, x.shape[0], num_out, num_in, x.stride(0),
        weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, ROWS=rows, **config, num_stages=1,
        **pdl_options(x.device),
    )  # fmt: skip
    return y


def rms_norm_gemv_rows(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    swiglu: bool = False,
    tiles: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h): y = rms_norm(h) weight^T (+ bias) [M, N] (silu(gate) * up, [M, N/2], with swiglu), row by row;
    h = x + residual as a new tensor, or x itself when residual is None."""
    check_norm_gemv_args(x, residual, norm_weight, weight, bias, swiglu, max_rows=MAX_ROWS)
    rows = triton.next_power_of_2(x.shape[0])
    if residual is not None and residual.stride() != x.stride():
        raise ValueError(f"residual must have x's strides {x.stride()}, got {residual.stride()}")
    config = _tiles(x, SWIGLU_TILES if swiglu else NORM_TILES, tiles)
    num_rows = weight.shape[0] // 2 if swiglu else weight.shape[0]
    y = torch.empty(x.shape[0], num_rows, device=x.device, dtype=x.dtype)
    # the kernel writes the new residual with x's row stride
    new_residual = (
        torch.empty_strided(x.shape, x.stride(), device=x.device, dtype=x.dtype) if residual is not None else x
    )
    _rms_norm_gemv_rows_kernel[(triton.cdiv(num_rows, config["BLOCK_N"]),)](
        x, residual if residual is not None else x, norm_weight, weight, bias if bias is not None else weight,
        y, new_residual, x.shape[0], num_rows, x.shape[1], x.stride(0), weight.stride(0), y.stride(0), float(eps),
        HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, SWIGLU=swiglu, ROWS=rows, **config,
        num_stages=1, **pdl_options(x.device),
    )  # fmt: skip
    return y, new_residual


# The references are the one-token kernels' (they are row-wise)
gemv_rows_ref = gemv_ref
rms_norm_gemv_rows_ref = rms_norm_gemv_ref
