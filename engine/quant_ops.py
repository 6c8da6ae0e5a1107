"""Where a quantized linear layer's matmul chooses, per call, its Triton kernel (kernels/quant_matmul.py) or
the torch reference; the choice follows engine/ops.py's process-wide kernel backend (`use_triton`).

The layers are engine/quantization/quantized_weight.py's; the layouts are kernels/quant_formats.py's. A
quantized layer never takes engine/ops.py's fused one-token paths (gemv, rms_norm_gemv, rms_norm_qkv_rope):
those read a dense weight; its layer runs the norm and this matmul apart.
"""

from __future__ import annotations

import torch

from engine.ops import use_triton
from kernels.quant_matmul import fp8_matmul_ref, int4_matmul_ref, int8_matmul_ref, nf4_matmul_ref
from kernels.rms_norm_fp8 import MAX_COLS as FP8_NORM_MAX_COLS


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [T, K] (q * s)^T -> [T, N]."""
    if use_triton(x):
        from kernels.quant_matmul import int8_matmul as kernel

        return kernel(x, qweight, scales, group_size)
    return int8_matmul_ref(x, qweight, scales, group_size)


def int4_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """x [T, K] ((q - z) * s)^T -> [T, N]."""
    if use_triton(x):
        from kernels.quant_matmul import int4_matmul as kernel

        return kernel(x, qweight, scales, zeros, group_size)
    return int4_matmul_ref(x, qweight, scales, zeros, group_size)


def nf4_linear(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """x [T, K] (NF4_CODEBOOK[q] * absmax)^T -> [T, N]."""
    if use_triton(x):
        from kernels.quant_matmul import nf4_matmul as kernel

        return kernel(x, qweight, absmax)
    return nf4_matmul_ref(x, qweight, absmax)


def fp8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None
) -> torch.Tensor:
    """x quantized to fp8 (per token, per 128-wide group for block-scaled weights, or by input_scale) times
    (q * weight_scale)^T -> [T, N] in x's dtype."""
    if use_triton(x):
        from kernels.quant_matmul import fp8_matmul as kernel

        return kernel(x, qweight, weight_scale, input_scale)
    return fp8_matmul_ref(x, qweight, weight_scale, input_scale)


def fuses_fp8_norm(x: torch.Tensor, num_in: int) -> bool:
    """Whether an fp8 projection of input width num_in with dynamic activation scales takes fp8_norm_linear: the
    kernels' backend, and a row one program of kernels/rms_norm_fp8.py holds (wider layers keep the norm and the
    quantization apart rather than fail)."""
    return num_in <= FP8_NORM_MAX_COLS and use_triton(x)


def fp8_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8_linear(rms_norm(x + residual)), x + residual) for dynamic activation scales, the norm and the
    quantization as one kernel (kernels/rms_norm_fp8.py: one launch a pre-norm fewer, decision 0072); without
    a residual the norm reads x and x is the residual returned. Callers check use_triton(x)."""
    from kernels.quant_matmul import fp8_activation_group, fp8_matmul_quantized
    from kernels.rms_norm_fp8 import rms_norm_fp8

    group = fp8_activation_group(qweight, weight_scale)
    xq, x_scales, residual = rms_norm_fp8(x, residual, norm_weight, eps, group)
    return fp8_matmul_quantized(xq, x_scales, qweight, weight_scale, x.dtype), residual
