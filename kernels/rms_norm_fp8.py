"""RMSNorm (with the fused residual add) whose output is an FP8 projection's activations: the norm of
kernels/rms_norm.py and the dynamic quantization of kernels/fp8_activations.py in one kernel.

Legend: M = tokens, K = hidden size, G = the activations' group along K (128, or K for per token).
    r = x + residual (rounded to x's dtype; the new residual), or x
    y = r / sqrt(mean(r^2) + eps) * w, rounded to x's dtype (as the unfused layer stores it)
    scales [M, ceil(K / G)] = max(amax(y[m, group]), AMAX_FLOOR) / 448
    yq [M, K] float8_e4m3fn = clamp(y / scale, -448, 448), rounded to nearest even
Math: the norm in fp32 as kernels/rms_norm.py computes it; the quantization as kernels/fp8_activations.py's
(a correctly rounded division, then round_to_e4m3), so the two kernels in a row and this one give the same
codes up to the order of the norm's sum of squares.

Why: a decoder layer with W8A8 fp8 projections ran the norm, then a quantization kernel that reread its
output, before each of its qkv and gate|up projections: two launches where one does, at one token about
2.4 us each on an H200 (decision 0072). Kernel: one program per token holds its whole row as
[K / G groups, G] (one group of the row for per-token scales).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.fp8_activations import round_to_e4m3
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref

MAX_COLS = 16384  # a row lives in one program's registers (kernels/fp8_activations.py's per-token limit)


@triton.jit
def _rms_norm_fp8_kernel(
    x_ptr,  # [M, K]
    res_ptr,  # [M, K] (read only when HAS_RESIDUAL)
    w_ptr,  # [K]
    yq_ptr,  # [M, K] float8_e4m3fn
    scales_ptr,  # [M, num_groups] fp32
    new_res_ptr,  # [M, K] (written only when HAS_RESIDUAL)
    K,
    stride_x,
    stride_r,
    num_groups,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    GROUPS: tl.constexpr,  # groups a program's tile holds (a power of two)
    GROUP: tl.constexpr,  # columns of a group (a power of two; the whole padded row for per token)
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    m = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS)[:, None]
    cols = g * GROUP + tl.arange(0, GROUP)[None, :]  # [GROUPS, GROUP]
    mask = cols < K
    x = tl.load(x_ptr + m * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + m * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(new_res_ptr.dtype.element_ty)  # rounded as the unfused layer stores it
        tl.store(new_res_ptr + m * K + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_sq = tl.sum(tl.sum(x * x, axis=1), axis=0) / K
    rstd = tl.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((x * rstd) * w).to(x_ptr.dtype.element_ty).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-10) / 448.0  # [GROUPS]; AMAX_FLOOR, FP8_MAX
    q = round_to_e4m3(tl.clamp(tl.math.div_rn(y, scale[:, None]), -448.0, 448.0))
    tl.store(yq_ptr + m * K + cols, q.to(yq_ptr.dtype.element_ty), mask=mask)
    gs = tl.arange(0, GROUPS)
    tl.store(scales_ptr + m * num_groups + gs, scale, mask=gs < num_groups)


def _check(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, group_size: int | None) -> None:
    check_device(
        _rms_norm_fp8_kernel, "x, residual and weight", x, weight, *([residual] if residual is not None else [])
    )
    check_float("x", x)
    check_float("weight", weight)
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got {tuple(x.shape)}")
    if x.shape[1] > MAX_COLS:
        raise ValueError(f"x's hidden size must be at most {MAX_COLS}, got {x.shape[1]}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight must have shape ({x.shape[1]},) for x of shape {tuple(x.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x in shape and dtype: x {tuple(x.shape)} {x.dtype}, "
            f"residual {tuple(residual.shape)} {residual.dtype}"
        )
    if group_size is not None and (group_size < 1 or group_size & (group_size - 1)):
        raise ValueError(f"group_size must be a power of two or None (per token), got {group_size}")


def rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, group_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(yq [M, K] float8_e4m3fn, scales fp32 [M, ceil(K / G)] (G = group_size, or K: [M, 1]), new residual
    x + residual, or x itself without one) for y = rms_norm(x + residual)."""
    _check(x, residual, weight, group_size)
    num_tokens, num_in = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    block = triton.next_power_of_2(max(num_in, 1))
    group = block if group_size is None else min(group_size, block)
    num_groups = triton.cdiv(num_in, num_in if group_size is None else group)
    yq = torch.empty(num_tokens, num_in, device=x.device, dtype=torch.float8_e4m3fn)
    scales = torch.empty(num_tokens, num_groups, device=x.device, dtype=torch.float32)
    new_residual = torch.empty(num_tokens, num_in, device=x.device, dtype=x.dtype) if residual is not None else x
    if num_tokens == 0 or num_in == 0:
        return yq, scales, new_residual
    _rms_norm_fp8_kernel[(num_tokens,)](
        x, residual if residual is not None else x, weight.contiguous(), yq, scales, new_residual,
        num_in, x.stride(0), residual.stride(0) if residual is not None else 0, num_groups, float(eps),
        HAS_RESIDUAL=residual is not None, GROUPS=block // group, GROUP=group,
        num_warps=16 if block > 8192 else max(1, min(8, block // 256)), **pdl_options(x.device),
    )  # fmt: skip
    return yq, scales, new_residual


def rms_norm_fp8_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, group_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unfused layer's math: the norm rounded to x's dtype, then its dynamic fp8 quantization."""
    from kernels.fp8_activations import quantize_fp8_activations_ref

    _check(x, residual, weight, group_size)
    if residual is None:
        normed, new_residual = rms_norm_ref(x, weight, eps), x
    else:
        normed, new_residual = fused_add_rms_norm_ref(x, residual, weight, eps)
    yq, scales = quantize_fp8_activations_ref(normed, group_size)
    return yq, scales, new_residual
