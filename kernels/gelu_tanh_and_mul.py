"""GELU-tanh-and-mul (GeGLU's gate, Gemma's MLP): x = [gate | up] along the last dim, y = gelu_tanh(gate) * up.

Legend: T = tokens, I = intermediate size. Input [T, 2I], output [T, I].
gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) = g / (1 + exp(-2u)) with u the tanh's argument
(kernels/gelu_tanh.py's form). Computed in fp32, rounded once. Precision: fp32 within 1e-5, bf16/fp16 one
rounding (transformers rounds gelu(gate) to the dtype before the product: within two roundings of it).

Kernel: kernels/silu_and_mul.py's grid, (T, cdiv(I, BLOCK)), each program BLOCK gates and ups of one row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, spread_block, warps_for_block
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)


@triton.jit
def _gelu_tanh_and_mul_kernel(
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
    u = SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
    y = gate / (1.0 + tl.exp(-2.0 * u)) * up
    tl.store(out_ptr + row * inter + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> gelu_tanh(x[..., :I]) * x[..., I:] as a new tensor [..., I]."""
    check_device(_gelu_tanh_and_mul_kernel, "x", x)
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
    _gelu_tanh_and_mul_kernel[grid](
        x2, out, inter, x2.stride(0), BLOCK=block, num_warps=warps_for_block(block), **pdl_options(x.device)
    )
    return out


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.gelu(gate, approximate="tanh") * up).to(x.dtype)
