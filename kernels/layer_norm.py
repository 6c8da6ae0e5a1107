"""LayerNorm (GPT-2).

Math: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b over the last dimension, in fp32,
rounded once to the input dtype (var is the biased variance, as torch's). Precision
contract as rms_norm.

Kernel: the tiling of rms_norm (BLOCK_R whole rows of BLOCK_N = next_pow2(N) columns
per program, two row dims with their own strides); mean and variance are taken in
two passes over the registers, not from sum(x^2), so large means do not cancel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import as_row_grid, check_device, check_float, warps_for
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

MAX_COLS = 65536  # one row lives in registers; wider rows would spill


@triton.jit
def _layer_norm_kernel(
    x_ptr,  # [A, B, N], last dim contiguous
    w_ptr,  # [N]
    b_ptr,  # [N]
    out_ptr,  # [A*B, N] contiguous
    num_rows,
    inner_rows,  # B: rows of the inner row dim
    stride_x_outer,
    stride_x_inner,
    n_cols,
    eps,
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
    x_off = (rows // inner_rows) * stride_x_outer + (rows % inner_rows) * stride_x_inner
    x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    centered = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / n_cols
    rstd = tl.rsqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = centered * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(out_ptr + rows[:, None] * n_cols + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of x [..., N] over its last dim with weight, bias [N]; returns a new tensor like x."""
    check_device(_layer_norm_kernel, "x, weight and bias", x, weight, bias)
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        check_float(name, t)
    if x.dim() < 1:
        raise ValueError("x must have at least one dim")
    n_cols = x.shape[-1]
    if weight.shape != (n_cols,) or bias.shape != (n_cols,):
        raise ValueError(
            f"weight and bias must have shape ({n_cols},), got {tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    if n_cols > MAX_COLS:
        raise ValueError(f"last dim of x must be at most {MAX_COLS}, got {n_cols}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_rows = x.numel() // n_cols if n_cols else 0
    if num_rows == 0 or n_cols == 0:
        return out
    x3 = as_row_grid(x if x.stride(-1) == 1 else x.contiguous())  # [A, B, N]
    block_n = triton.next_power_of_2(n_cols)
    block_r = min(triton.next_power_of_2(num_rows), max(1, 4096 // block_n))
    _layer_norm_kernel[(triton.cdiv(num_rows, block_r),)](
        x3, weight.contiguous(), bias.contiguous(), out,
        num_rows, x3.shape[1], x3.stride(0), x3.stride(1), n_cols, float(eps),
        BLOCK_R=block_r, BLOCK_N=block_n, num_warps=warps_for(block_r * block_n), **pdl_options(x.device),
    )  # fmt: skip
    return out


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
    return y.to(x.dtype)
