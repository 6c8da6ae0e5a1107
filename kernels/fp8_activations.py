"""FP8 (e4m3) quantization of a linear layer's activations, dynamic or static.

Legend: M = tokens, K = input features, G = group size along K.
    dynamic, groups:    scales [M, ceil(K / G)] = max(amax(x[m, group]), AMAX_FLOOR) / 448
    dynamic, per token: scales [M, 1]           = max(amax(x[m, :]), AMAX_FLOOR) / 448
    static:             scales [1, 1]           = input_scale
    xq [M, K] float8_e4m3fn = clamp(x / scale, -448, 448), rounded to nearest even
Math: fp32, a correctly rounded division (not a product with the reciprocal), so the kernel and the
reference agree bit for bit.

Why a separate kernel: the quantized activations are read by every program of the FP8 GEMM (one per
output tile), so quantizing once costs M * K bytes of writes against quantizing in each of the GEMM's
programs. Kernel: one program per (token, group); the per-token case is one group of K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.quant_formats import FP8_MAX, check_activations

AMAX_FLOOR = 1e-10  # an all-zero group gets a tiny scale (its codes are 0), not a division by zero


@triton.jit
def _quantize_fp8_kernel(
    x_ptr,  # [M, K]
    xq_ptr,  # [M, K] float8_e4m3fn
    scales_ptr,  # [M, num_groups] fp32 (written), or [1, 1] (read, STATIC)
    K,
    stride_x,
    num_groups,
    GROUP: tl.constexpr,  # elements per group (K for per token)
    BLOCK: tl.constexpr,  # a power of two >= GROUP
    STATIC: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    m = tl.program_id(0)
    g = tl.program_id(1)
    k = g * GROUP + tl.arange(0, BLOCK)
    mask = (tl.arange(0, BLOCK) < GROUP) & (k < K)
    pdl_wait(PDL)
    x = tl.load(x_ptr + m.to(tl.int64) * stride_x + k, mask=mask, other=0.0).to(tl.float32)
    if STATIC:
        scale = tl.load(scales_ptr)
    else:
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10) / 448.0
        tl.store(scales_ptr + m * num_groups + g, scale)
    q = round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -448.0, 448.0))
    tl.store(xq_ptr + m.to(tl.int64) * K + k, q.to(xq_ptr.dtype.element_ty), mask=mask)


@triton.jit
def round_to_e4m3(q):
    """fp32 q (|q| <= 448) rounded to the nearest e4m3 value, ties to even, still fp32.

    Why not only the cast: Triton 3.6's interpreter casts fp32 to fp8 by cutting the mantissa and adding
    the cut-off bit without carrying it into the exponent (124.3 becomes 64, not 128); on the GPU the cast
    rounds as this does, so rounding first makes the cast exact on both. Normal values keep 3 of fp32's 23
    mantissa bits (round to nearest even on the magnitude's bit pattern, the carry running into the
    exponent);
    below 2^-6 e4m3 is subnormal, a fixed step of 2^-9 (rounded by adding and removing 1.5 * 2^23).
    """
    # the sign bit, put back by bits (-0.0 too: a code that rounds to 0 keeps its sign, as the cast does)
    sign = (q.to(tl.int32, bitcast=True) >> 31) << 31
    a = tl.abs(q)
    bits = a.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    normal = bits.to(tl.float32, bitcast=True)
    subnormal = ((a * 512.0 + 12582912.0) - 12582912.0) / 512.0
    r = tl.where(a < 0.015625, subnormal, normal)
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


def _check(x: torch.Tensor, group_size: int | None, input_scale: torch.Tensor | None) -> None:
    check_activations(x, x.shape[-1] if x.dim() == 2 else -1)
    if group_size is not None and (group_size < 1 or group_size & (group_size - 1)):
        raise ValueError(f"group_size must be a power of two or None (per token), got {group_size}")
    if input_scale is not None:
        if input_scale.numel() != 1 or input_scale.dtype != torch.float32:
            raise ValueError(
                f"input_scale must be one float32 value, got {list(input_scale.shape)} {input_scale.dtype}"
            )
        if group_size is not None:
            raise ValueError("input_scale is a static per-tensor scale: group_size must be None with it")


def quantize_fp8_activations(
    x: torch.Tensor, group_size: int | None = None, *, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq [M, K] float8_e4m3fn, scales fp32): per group of group_size along K ([M, ceil(K/G)]),
    per token (group_size None: [M, 1]) or the static input_scale ([1, 1])."""
    _check(x, group_size, input_scale)
    check_device(_quantize_fp8_kernel, "x and input_scale", x, *([input_scale] if input_scale is not None else []))
    num_tokens, num_in = x.shape
    group = num_in if group_size is None or input_scale is not None else group_size
    num_groups = 1 if input_scale is not None else triton.cdiv(num_in, group)
    xq = torch.empty(num_tokens, num_in, device=x.device, dtype=torch.float8_e4m3fn)
    if input_scale is not None:
        scales = input_scale.reshape(1, 1).contiguous()
    else:
        scales = torch.empty(num_tokens, num_groups, device=x.device, dtype=torch.float32)
    if num_tokens == 0:
        return xq, scales
    # NOTE: a static scale quantizes in chunks of at most 4096 elements a program (no reduction across them);
    # a dynamic per-token scale reduces a whole row in one program (16 warps past 8192 columns; rows past
    # 16384 columns spill registers at sm_90)
    block = triton.next_power_of_2(group)
    if input_scale is not None:
        block = min(block, 4096)
        group, num_groups_grid = block, triton.cdiv(num_in, block)
    else:
        num_groups_grid = num_groups
    _quantize_fp8_kernel[(num_tokens, num_groups_grid)](
        x, xq, scales, num_in, x.stride(0), num_groups,
        GROUP=group, BLOCK=block, STATIC=input_scale is not None,
        num_warps=16 if block > 8192 else max(1, min(8, block // 256)), **pdl_options(x.device),
    )  # fmt: skip
    return xq, scales


def quantize_fp8_activations_ref(
    x: torch.Tensor, group_size: int | None = None, *, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, group_size, input_scale)
    num_tokens, num_in = x.shape
    xf = x.float()
    if input_scale is not None:
        scales = input_scale.reshape(1, 1).float()
        spread = scales
    else:
        group = num_in if group_size is None else group_size
        num_groups = -(-num_in // group)
        padded = torch.nn.functional.pad(xf.abs(), (0, num_groups * group - num_in))
        amax = padded.reshape(num_tokens, num_groups, group).amax(dim=-1)
        scales = amax.clamp(min=AMAX_FLOOR) / FP8_MAX
        spread = scales.repeat_interleave(group, dim=1)[:, :num_in]
    xq = (xf / spread).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return xq, scales
