"""Matrix-vector product for one token (batch-1 decode).

Legend: K = input features, N = output features.
    gemv(x [1, K], w [N, K], bias [N] | None) -> y [1, N] = x w^T (+ bias)
Math: fp32 products and sums, one rounding of y to x's dtype. Precision contract: F.linear's
result within the dtype's accumulation tolerance (the sum runs in another order than cuBLAS's).

Why: at one token a projection is a pure weight stream, and cuBLAS's M = 1 kernels read the
Llama-3.1-8B shape's o_proj at 65% and its lm_head at 92% of the measured read bandwidth,
where this kernel reads them at 76% and 100% (H100, bench/results/h100/gemv_sweep_session6.json).
In the engine's graphed 8B decode step: 6.17 -> 5.99 ms. The engine uses it only for one token
and weights of at least 4096 x 4096 (engine/ops.py says why); wider batches are matmuls.
A variant that computed SiLU-and-mul while loading the down projection's input was slower
(6.13 ms): every program recomputed the activation of the whole input.

Kernel: each program owns BLOCK_N output rows and walks K in BLOCK_K chunks, accumulating
w * x in a [BLOCK_N, BLOCK_K] fp32 tile that it reduces once at the end; rows are read
contiguously along K. BLOCK_N = 4, BLOCK_K = 512, 8 warps, 3 stages won bench/gemv_sweep.py
on every 8B shape (the qkv projection a tie).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, check_last_dim_contiguous
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 4, 512, 8, 3


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
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    # The first chunk of weights is loaded before the wait for the kernel before (kernels/_pdl.py):
    # with PDL it streams while that kernel finishes. The loop goes on from the second chunk.
    # NOTE: a first chunk 2-4x wider (all of K at 1B) made the 1B / 8B steps 3-5x slower (H100,
    # bench/results/h100/decode_ab_session10.md), so it is one loop chunk. So did an unrolled loop
    # (2 or 4 chunks an iteration, their loads issued together): 1B 1.19 -> 1.21-1.23 ms, 8B 5.78 -> 5.99-6.17.
    k = tl.arange(0, BLOCK_K)
    k_mask = k < K
    w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    pdl_wait(PDL)
    x = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
    acc = w.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [1, N] = x [1, K] weight[N, K]^T (+ bias)."""
    check_device(_gemv_kernel, "x, weight and bias", x, weight, *([bias] if bias is not None else []))
    check_float("x", x)
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got {tuple(x.shape)}: gemv is for a single token")
    if weight.dim() != 2 or weight.dtype != x.dtype:
        raise ValueError(f"weight must be [N, K] of x's dtype {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    num_out, num_in = weight.shape
    if x.shape[1] != num_in:
        raise ValueError(f"x has {x.shape[1]} features, the weight [N, K={num_in}] needs K")
    if bias is not None and (bias.shape != (num_out,) or bias.dtype != x.dtype or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{num_out}] tensor of x's dtype, got {tuple(bias.shape)}")
    check_last_dim_contiguous("x", x)
    check_last_dim_contiguous("weight", weight)
    y = torch.empty(1, num_out, device=x.device, dtype=x.dtype)
    _gemv_kernel[(triton.cdiv(num_out, BLOCK_N),)](
        x, weight, bias if bias is not None else weight, y, num_out, num_in, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES, **pdl_options(x.device),
    )  # fmt: skip
    return y


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)
