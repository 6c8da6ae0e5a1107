"""GELU, tanh approximation (GPT-2's "gelu_new"):
y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). fp32 math, one rounding.

Kernel: 0.5 (1 + tanh(u)) = sigmoid(2u), so y = x / (1 + exp(-2u)): no tanh needed,
no cancellation near 0, and -0 rather than NaN for very negative x. Elementwise over
the flattened tensor, 256 to 2048 elements per program (see spread_block). Precision: fp32 within 1e-5,
bf16/fp16 one rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, spread_block, warps_for_block
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)


@triton.jit
def _gelu_tanh_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # nothing here reads weights before its first dependent load (kernels/_pdl.py)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    y = x / (1.0 + tl.exp(-2.0 * u))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """Elementwise tanh-GELU of x (any shape); returns a new contiguous tensor like x."""
    check_device(_gelu_tanh_kernel, "x", x)
    check_float("x", x)
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        block = spread_block(x.numel())
        _gelu_tanh_kernel[(triton.cdiv(x.numel(), block),)](
            x, out, x.numel(), BLOCK=block, num_warps=warps_for_block(block), **pdl_options(x.device)
        )
    return out


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)
