"""RMSNorm (after the residual add) fused into the one-token projection that reads it, with an
optional SwiGLU (SiLU-and-mul) on the projection's output: a pre-norm decoder layer's
norm -> qkv and norm -> gate|up -> silu * up, each in one kernel at batch-1 decode.

Legend: K = hidden size (input features), N = output rows of the weight, I = N / 2 (SwiGLU).
    h = x + residual, rounded to x's dtype (the new residual stream; h = x without a residual)
    rstd = 1 / sqrt(mean(h^2) + eps)
    y = (h * rstd * g) W^T (+ bias)                                  -> [1, N]
    SwiGLU (W = [W_gate; W_up], [2I, K]): y = silu(y[:I]) * y[I:]    -> [1, I]
Math: rstd is a scalar, so it factors out of every dot product:
    y_n = rstd * sum_k W[n, k] h_k g_k
Each program therefore accumulates the products and sum_k h_k^2 in the same pass over K and
scales once at the end: no pre-pass over h, no normalized copy in memory. fp32 sums, one
rounding of the output to x's dtype.

Precision contract: the fp32 math of rms_norm_ref -> F.linear (-> silu_and_mul_ref) on the same
rounded h, within the summation-order tolerance and one rounding of the output. The unfused
path also rounds the normalized input (and the gate|up output) to x's dtype, which this kernel
does not: against it, 16-bit results differ by about one rounding of those intermediates.

Why: at one token each RMSNorm and the SiLU-and-mul are tiny kernels (mostly launch and first-load
latency) between weight-streaming projections; folding them into the projections removes up to three
kernels a layer and their intermediate writes. The engine keeps SwiGLU apart above a hidden size of 2048,
where two row sets streamed slower than the kernel they saved (engine/ops.py, decision 0016).

Kernel: as kernels/gemv.py (each program owns BLOCK_N output rows, walks K in BLOCK_K chunks,
reduces a [BLOCK_N, BLOCK_K] fp32 tile once at the end). Every program reads all of h (and g)
anyway, so each computes the sum of squares itself; program 0 alone writes the new residual.
With SwiGLU a program owns BLOCK_N gate rows and the BLOCK_N up rows I below them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, check_last_dim_contiguous
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.gemv import weight_chunk
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.silu_and_mul import silu_and_mul_ref

# Tiles: 8 rows a program, 512 columns a step, 4 warps. The row count is the engine's choice, not the per-shape
# sweep's (decision 0016); module-level so that `bench/decode_latency.py --tiles` can try others in the engine.
# PREFETCH 1 keeps the next chunk's weight load in flight while a chunk is multiplied (kernels/gemv.py's wide
# schedule; Triton does not pipeline these loads itself); it made the step slower, so it is off (decision 0012).
TILES = {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 3, "PREFETCH": 0}
# With SwiGLU (hidden sizes up to 2048: Llama-3.2-1B, Qwen3-0.6B) 4 gate + 4 up rows on 2 warps, the fastest
# of the tiles tried in the engine (decision 0016).
SWIGLU_TILES = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 2, "num_stages": 3, "PREFETCH": 0}
TILE_KEYS = tuple(TILES)


@triton.jit
def normed_chunk(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, k, k_mask, pid, HAS_RESIDUAL: tl.constexpr):
    """One chunk of the norm's input: (h * g, h * h) in fp32, h = x (+ residual, written by program 0)."""
    h = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        # NOTE: the sum is rounded to the activation dtype before it is normalized, as the
        # unfused model stores it (and kernels/rms_norm.py's fused add does).
        summed = (h + tl.load(res_ptr + k, mask=k_mask, other=0.0).to(tl.float32)).to(new_res_ptr.dtype.element_ty)
        tl.store(new_res_ptr + k, summed, mask=k_mask & (pid == 0))
        h = summed.to(tl.float32)
    return h * tl.load(norm_w_ptr + k, mask=k_mask, other=0.0).to(tl.float32), h * h


@triton.jit
def _rms_norm_gemv_kernel(
    x_ptr,  # [1, K] the layer's input before the norm
    res_ptr,  # [1, K] the residual stream (read only when HAS_RESIDUAL)
    norm_w_ptr,  # [K] the RMSNorm weight g
    w_ptr,  # [N, K] (SwiGLU: [2I, K], gate rows then up rows)
    bias_ptr,  # [N] (read only when HAS_BIAS)
    y_ptr,  # [1, N] (SwiGLU: [1, I])
    new_res_ptr,  # [1, K] h = x + residual (written by program 0 only when HAS_RESIDUAL)
    num_rows,  # N (SwiGLU: I), the output rows
    K,
    stride_wn,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SWIGLU: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < num_rows
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    if SWIGLU:
        up_rows = w_ptr + (n[:, None] + num_rows).to(tl.int64) * stride_wn
    # The first chunk of weights is loaded before the wait for the kernel before (kernels/_pdl.py):
    # with PDL it streams while that kernel finishes. The loop goes on from the second chunk (a wider
    # first chunk made the step slower: decision 0012).
    k = tl.arange(0, BLOCK_K)
    k_mask = k < K
    wk_mask = n_mask[:, None] & k_mask[None, :]
    w = tl.load(w_rows + k[None, :], mask=wk_mask, other=0.0)
    if SWIGLU:
        w_up = tl.load(up_rows + k[None, :], mask=wk_mask, other=0.0)
    pdl_wait(PDL)
    if PREFETCH:  # the second chunk's weights in flight while the first is multiplied
        w_next = weight_chunk(w_rows, n_mask, BLOCK_K, K, BLOCK_K)
        if SWIGLU:
            w_up_next = weight_chunk(up_rows, n_mask, BLOCK_K, K, BLOCK_K)
    hg, sum_sq = normed_chunk(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, k, k_mask, pid, HAS_RESIDUAL)
    acc = w.to(tl.float32) * hg[None, :]  # gate rows under SwiGLU
    if SWIGLU:
        acc_up = w_up.to(tl.float32) * hg[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        if PREFETCH:
            w = w_next
            w_next = weight_chunk(w_rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)
            if SWIGLU:
                w_up = w_up_next
                w_up_next = weight_chunk(up_rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)
        hg, chunk_sq = normed_chunk(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, k, k_mask, pid, HAS_RESIDUAL)
        sum_sq += chunk_sq
        if not PREFETCH:
            w = weight_chunk(w_rows, n_mask, k0, K, BLOCK_K)
        acc += w.to(tl.float32) * hg[None, :]
        if SWIGLU:
            if not PREFETCH:
                w_up = weight_chunk(up_rows, n_mask, k0, K, BLOCK_K)
            acc_up += w_up.to(tl.float32) * hg[None, :]
    rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / K + eps)
    y = tl.sum(acc, axis=1) * rstd
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    if SWIGLU:
        up = tl.sum(acc_up, axis=1) * rstd
        if HAS_BIAS:
            up += tl.load(bias_ptr + num_rows + n, mask=n_mask, other=0.0).to(tl.float32)
        y = y / (1.0 + tl.exp(-y)) * up
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def check_norm_gemv_args(x, residual, norm_weight, weight, bias, swiglu: bool = False, max_rows: int = 1) -> None:
    """The checks of a norm + projection's arguments: one token (shared with kernels/rms_norm_qkv_rope.py), or up
    to max_rows token rows (kernels/gemv_rows.py)."""
    tensors = [x, norm_weight, weight] + [t for t in (residual, bias) if t is not None]
    check_device(_rms_norm_gemv_kernel, "x, residual, norm_weight, weight and bias", *tensors)
    check_float("x", x)
    check_float("norm_weight", norm_weight)
    if max_rows == 1 and (x.dim() != 2 or x.shape[0] != 1):
        raise ValueError(f"x must be one row [1, K], got {tuple(x.shape)}: rms_norm_gemv is for a single token")
    if x.dim() != 2 or not 1 <= x.shape[0] <= max_rows:
        raise ValueError(f"x must be [M, K] with 1 <= M <= {max_rows} token rows, got {tuple(x.shape)}")
    num_in = x.shape[1]
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
        )
    if norm_weight.shape != (num_in,) or not norm_weight.is_contiguous():
        raise ValueError(f"norm_weight must be a contiguous [{num_in}] tensor, got {tuple(norm_weight.shape)}")
    if weight.dim() != 2 or weight.dtype != x.dtype:
        raise ValueError(f"weight must be [N, K] of x's dtype {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    if weight.shape[1] != num_in:
        raise ValueError(f"x has {num_in} features, the weight [N, K={weight.shape[1]}] needs K")
    if swiglu and weight.shape[0] % 2:
        raise ValueError(f"swiglu needs an even number of weight rows (gate | up), got {weight.shape[0]}")
    num_out = weight.shape[0]
    if bias is not None and (bias.shape != (num_out,) or bias.dtype != x.dtype or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{num_out}] tensor of x's dtype, got {tuple(bias.shape)}")
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        if t is not None:
            check_last_dim_contiguous(name, t)


def rms_norm_gemv(
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
    """(y, h): y = rms_norm(h) weight^T (+ bias) [1, N] (silu(gate) * up, [1, N/2], with swiglu);
    h = x + residual as a new tensor, or x itself when residual is None.

    tiles overrides BLOCK_N, BLOCK_K, num_warps, num_stages or PREFETCH (benchmark sweeps, engine A/Bs).
    """
    check_norm_gemv_args(x, residual, norm_weight, weight, bias, swiglu)
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    config = {**(SWIGLU_TILES if swiglu else TILES), **(tiles or {})}
    num_rows = weight.shape[0] // 2 if swiglu else weight.shape[0]
    y = torch.empty(1, num_rows, device=x.device, dtype=x.dtype)
    new_residual = torch.empty_like(x) if residual is not None else x
    _rms_norm_gemv_kernel[(triton.cdiv(num_rows, config["BLOCK_N"]),)](
        x, residual if residual is not None else x, norm_weight, weight, bias if bias is not None else weight,
        y, new_residual, num_rows, x.shape[1], weight.stride(0), float(eps),
        HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, SWIGLU=swiglu, **config,
        **pdl_options(x.device),
    )  # fmt: skip
    return y, new_residual


def rms_norm_gemv_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    swiglu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused layer: (fused-add) RMSNorm, F.linear, SiLU-and-mul, each rounded to x's dtype."""
    if residual is None:
        normed, new_residual = rms_norm_ref(x, norm_weight, eps), x
    else:
        normed, new_residual = fused_add_rms_norm_ref(x, residual, norm_weight, eps)
    y = F.linear(normed, weight, bias)
    return (silu_and_mul_ref(y) if swiglu else y), new_residual
