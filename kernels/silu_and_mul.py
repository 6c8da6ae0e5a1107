"""SiLU-and-mul (SwiGLU's gate): x = [gate | up] along the last dim, y = silu(gate) * up.

Legend: T = tokens, I = intermediate size. Input [T, 2I], output [T, I].
Computed in fp32, rounded once. Precision: fp32 within 1e-5, bf16/fp16 one rounding.

Kernel: grid (T, cdiv(I, BLOCK)); each program reads BLOCK gate and BLOCK up values
of one row and writes BLOCK outputs, BLOCK from 256 (a few tokens: spread over the
SMs) to 2048 (many tokens). silu(g) = g / (1 + exp(-g)) (-0 for very negative g).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, spread_block, warps_for_block
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [T, 2I], last dim contiguous
    out_ptr,  # [T, I] contiguous
    inter,  # I
    stride_x_row,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # nothing here reads weights before its first dependent load (kernels/_pdl.py)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x_row + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * inter + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:] as a new tensor [..., I]."""
    check_device(_silu_and_mul_kernel, "x", x)
    check_float("x", x)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"last dim of x must be even (gate | up), got shape {tuple(x.shape)}")
    inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = x.reshape(-1, x.shape[-1])  # [T, 2I], a view where possible
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    block = min(spread_block(out.numel()), triton.next_power_of_2(inter))
    grid = (x2.shape[0], triton.cdiv(inter, block))
    _silu_and_mul_kernel[grid](
        x2, out, inter, x2.stride(0), BLOCK=block, num_warps=warps_for_block(block), **pdl_options(x.device)
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
