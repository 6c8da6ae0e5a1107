"""RMSNorm and fused residual-add + RMSNorm.

Math: y = x / sqrt(mean(x^2) + eps) * w, over the last dimension, computed in fp32
and rounded once to the input dtype. The fused form first forms r = x + residual
(rounded to the input dtype, as an unfused model would store it), returns r as the
new residual and y = rmsnorm(r).

Precision contract: fp32 inputs match the reference within 1e-5; fp16/bf16 within
one rounding of the output dtype (atol 1e-2 for unit-scale inputs).

Kernel: each program normalizes a [BLOCK_R, BLOCK_N] tile, BLOCK_R whole rows of
BLOCK_N = next_pow2(N) columns (several rows per program when rows are short,
e.g. Qwen3's per-head q/k norm with N = 128). Rows are addressed through two row
dims [A, B] with their own strides so per-head views need no copy. Outputs are new
contiguous tensors; inputs are never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import (
    as_row_grid,
    check_device,
    check_float,
    warps_for,
)
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

MAX_COLS = 65536  # one row lives in registers; wider rows would spill
TILE_KEYS = ("BLOCK_R", "num_warps")


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [A, B, N], last dim contiguous
    res_ptr,  # [A, B, N] residual (read only when HAS_RESIDUAL)
    w_ptr,  # [N]
    out_ptr,  # [A*B, N] contiguous
    new_res_ptr,  # [A*B, N] contiguous (written only when HAS_RESIDUAL)
    num_rows,
    inner_rows,  # B: rows of the inner row dim
    stride_x_outer,
    stride_x_inner,
    stride_r_outer,
    stride_r_inner,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # nothing here reads weights before its first dependent load (kernels/_pdl.py)
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < num_rows)[:, None] & col_mask[None, :]
    outer, inner = rows // inner_rows, rows % inner_rows
    x_off = outer * stride_x_outer + inner * stride_x_inner
    x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    out_off = rows[:, None] * n_cols + cols[None, :]
    if HAS_RESIDUAL:
        r_off = outer * stride_r_outer + inner * stride_r_inner
        r = tl.load(res_ptr + r_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # NOTE: round the sum to the activation dtype before normalizing it, as the
        # unfused model (and the reference) does.
        summed = (x + r).to(new_res_ptr.dtype.element_ty)
        tl.store(new_res_ptr + out_off, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=1) / n_cols
    rstd = tl.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = (x * rstd[:, None]) * w[None, :]
    tl.store(out_ptr + out_off, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_device(_rms_norm_kernel, "x and weight", x, weight)
    check_float("x", x)
    check_float("weight", weight)
    if x.dim() < 1:
        raise ValueError("x must have at least one dim")
    if weight.shape != (x.shape[-1],):
        raise ValueError(
            f"weight must have shape ({x.shape[-1]},) for x of shape {tuple(x.shape)}, got {tuple(weight.shape)}"
        )
    if x.shape[-1] > MAX_COLS:
        raise ValueError(f"last dim of x must be at most {MAX_COLS}, got {x.shape[-1]}")


def _row_tile(num_rows: int, block_n: int, tiles: dict | None) -> dict:
    """BLOCK_R rows per program (4096 elements' worth) and num_warps; `tiles` overrides either."""
    block_r = min(triton.next_power_of_2(num_rows), max(1, 4096 // block_n))
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    config = dict(BLOCK_R=block_r, num_warps=warps_for(block_r * block_n))
    config.update(tiles or {})
    return config


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, tiles: dict | None):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(out) if residual is not None else out
    n_cols = x.shape[-1]
    num_rows = x.numel() // n_cols if n_cols else 0
    if num_rows == 0 or n_cols == 0:
        return out, new_residual
    if x.stride(-1) != 1:
        x = x.contiguous()
    x3 = as_row_grid(x)  # [A, B, N]
    r3 = x3
    if residual is not None:
        r3 = as_row_grid(residual if residual.stride(-1) == 1 else residual.contiguous())
    block_n = triton.next_power_of_2(n_cols)
    config = _row_tile(num_rows, block_n, tiles)
    _rms_norm_kernel[(triton.cdiv(num_rows, config["BLOCK_R"]),)](
        x3, r3, weight.contiguous(), out, new_residual,
        num_rows, x3.shape[1],
        x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
        n_cols, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK_N=block_n, **config, **pdl_options(x.device),
    )  # fmt: skip
    return out, new_residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, tiles: dict | None = None) -> torch.Tensor:
    """RMSNorm of x [..., N] over its last dim with weight [N]; returns a new tensor like x.

    tiles overrides BLOCK_R (rows per program) or num_warps (benchmark sweeps).
    """
    _check(x, weight)
    return _launch(x, None, weight, eps, tiles)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, tiles: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual) from one pass over x and residual (tiles: as rms_norm)."""
    _check(x, weight)
    check_device(_rms_norm_kernel, "x and residual", x, residual)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x in shape and dtype: x {tuple(x.shape)} {x.dtype}, "
            f"residual {tuple(residual.shape)} {residual.dtype}"
        )
    return _launch(x, residual, weight, eps, tiles)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight, computed in fp32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    r = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(r, weight, eps), r
