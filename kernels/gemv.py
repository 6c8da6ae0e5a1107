"""Matrix-vector product for one token (batch-1 decode).

Legend: K = input features, N = output features.
    gemv(x [1, K], w [N, K], bias [N] | None) -> y [1, N] = x w^T (+ bias)
Math: fp32 products and sums, one rounding of y to x's dtype. Precision contract: F.linear's
result within the dtype's accumulation tolerance (the sum runs in another order than cuBLAS's).

Why: at one token a projection is a pure weight stream, which cuBLAS's M = 1 kernels read below the
bandwidth this kernel reaches (decision 0014). The engine takes it only for one token and weights above
engine/ops.py's thresholds; wider batches are matmuls. Computing SiLU-and-mul while loading the down
projection's input is not done: every program would recompute the activation of the whole input
(decision 0012).

Kernel: each program owns BLOCK_N output rows and walks K in BLOCK_K chunks, accumulating
w * x in a [BLOCK_N, BLOCK_K] fp32 tile that it reduces once at the end; rows are read
contiguously along K. Triton software-pipelines only loads that feed a tl.dot, so
num_stages does nothing here: the loop itself says how many chunks are in flight (gemv_tiles).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, check_last_dim_contiguous, num_sms
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

# Tiles: 4 rows a program on 8 warps, 512 columns a step with one chunk in flight. Where the grid has few
# programs (at most FEW_PROGRAMS_PER_SM an SM: the 1B model's 2048-row projections) each SM holds too few to
# cover DRAM latency with one chunk each, so WIDE_TILE takes 1024 columns a step with two more in flight.
# Other rows and warps were slower or equal in the engine (decisions 0014, 0017).
TILE = {"BLOCK_N": 4, "BLOCK_K": 512, "PREFETCH": False, "num_warps": 8}
WIDE_TILE = {"BLOCK_N": 4, "BLOCK_K": 1024, "PREFETCH": True, "num_warps": 8}
FEW_PROGRAMS_PER_SM = 4


@triton.jit
def x_tile(x_ptr, n, k, k_mask):
    """x[k] as a [BLOCK_N, BLOCK_K] tile in the weight tile's layout, fp32.

    Why not one [BLOCK_K] row broadcast: Triton loads that row in its own layout and moves it into
    the weight tile's through shared memory, two barriers a chunk that hold back the next chunk's
    weight load. Each row of this tile reads the same addresses, L1 hits (decision 0014).
    """
    return tl.load(x_ptr + k[None, :] + 0 * n[:, None], mask=k_mask[None, :], other=0.0).to(tl.float32)


@triton.jit
def weight_chunk(rows, n_mask, k0, K, BLOCK_K: tl.constexpr):
    """Weight rows (a [BLOCK_N, 1] tensor of row pointers) -> their columns k0 .. k0 + BLOCK_K, 0 past K
    and in masked-off rows (shared with kernels/rms_norm_gemv.py)."""
    k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0.0)


@triton.jit
def gemv_rows(w, x_ptr, w_rows, n, n_mask, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """sum_k w_rows[n, k] x[k] in fp32 ([BLOCK_N]), given the first chunk `w` (loaded by the caller, before
    its PDL wait): the K loop and its load schedule."""
    if PREFETCH:  # chunk k + 1 is in flight at the top of step k, k + 2 issued in it
        w_next = weight_chunk(w_rows, n_mask, BLOCK_K, K, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if PREFETCH:
            w_after = weight_chunk(w_rows, n_mask, k0 + 2 * BLOCK_K, K, BLOCK_K)
        k = k0 + tl.arange(0, BLOCK_K)
        acc += w.to(tl.float32) * x_tile(x_ptr, n, k, k < K)
        if PREFETCH:
            w = w_next
            w_next = w_after
        else:
            w = weight_chunk(w_rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [1, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] (read only when HAS_BIAS)
    y_ptr,  # [1, N]
    N,
    K,
    stride_wn,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    # The first chunk of weights is loaded before the wait for the kernel before (kernels/_pdl.py):
    # with PDL it streams while that kernel finishes.
    # NOTE: the first chunk is one loop chunk: a wider one, and an unrolled loop, made the step slower
    # (decision 0012).
    k = tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0.0)
    pdl_wait(PDL)
    y = gemv_rows(w, x_ptr, w_rows, n, n_mask, K, BLOCK_N, BLOCK_K, PREFETCH)
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    # NOTE: rounded to x's dtype first, as F.linear rounds, also where y is wider (fp32 logits)
    tl.store(y_ptr + n, y.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv_tiles(num_out: int, sms: int) -> dict:
    """The tile (BLOCK_N, BLOCK_K, PREFETCH, num_warps) for N output rows on a GPU of `sms` SMs (0: the
    interpreter): WIDE_TILE, the wide prefetching step, where TILE's grid has few programs an SM."""
    return dict(WIDE_TILE if few_programs_per_sm(triton.cdiv(num_out, TILE["BLOCK_N"]), sms) else TILE)


def few_programs_per_sm(programs: int, sms: int) -> bool:
    """Whether a grid of `programs` leaves each of `sms` SMs at most FEW_PROGRAMS_PER_SM (never on the
    interpreter, sms = 0): where one chunk in flight a program cannot cover DRAM latency, so the one-token
    projections take wider chunks (gemv_tiles; kernels/rms_norm_qkv_rope.py's qkv_rope_tiles)."""
    return programs <= FEW_PROGRAMS_PER_SM * sms


def check_projection_args(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None
) -> tuple[int, int]:
    """(N, K) of a projection x [M, K] weight[N, K]^T (+ bias) in x's dtype, after the checks gemv and
    kernels/gemv_rows.py share (x's rows are the caller's to check)."""
    check_float("x", x)
    if weight.dim() != 2 or weight.dtype != x.dtype:
        raise ValueError(f"weight must be [N, K] of x's dtype {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    num_out, num_in = weight.shape
    if x.shape[1] != num_in:
        raise ValueError(f"x has {x.shape[1]} features, the weight [N, K={num_in}] needs K")
    if bias is not None and (bias.shape != (num_out,) or bias.dtype != x.dtype or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{num_out}] tensor of x's dtype, got {tuple(bias.shape)}")
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f"out_dtype must be a floating dtype, got {out_dtype}")
    check_last_dim_contiguous("x", x)
    check_last_dim_contiguous("weight", weight)
    return num_out, num_in


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    tiles: dict | None = None,
) -> torch.Tensor:
    """y [1, N] = x [1, K] weight[N, K]^T (+ bias), rounded to x's dtype and stored as out_dtype (default
    x's): F.linear(x, weight, bias).to(out_dtype) without the cast's kernel (the LM head's fp32 logits).
    tiles overrides entries of the tile gemv_tiles picks (tests, sweeps)."""
    check_device(_gemv_kernel, "x, weight and bias", x, weight, *([bias] if bias is not None else []))
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got {tuple(x.shape)}: gemv is for a single token")
    num_out, num_in = check_projection_args(x, weight, bias, out_dtype)
    config = gemv_tiles(num_out, num_sms(x.device) if x.device.type == "cuda" else 0)
    unknown = set(tiles or {}) - set(config)
    if unknown:
        raise ValueError(f"tiles may set only {sorted(config)}, got {sorted(unknown)}")
    config.update(tiles or {})
    y = torch.empty(1, num_out, device=x.device, dtype=out_dtype or x.dtype)
    _gemv_kernel[(triton.cdiv(num_out, config["BLOCK_N"]),)](
        x, weight, bias if bias is not None else weight, y, num_out, num_in, weight.stride(0),
        HAS_BIAS=bias is not None, **config, num_stages=1, **pdl_options(x.device),
    )  # fmt: skip
    return y


def gemv_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    y = F.linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)
