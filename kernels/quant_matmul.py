"""Linear layers on quantized weights: y [M, N] = x [M, K] W^T, one public function per format.

Legend: M = tokens, N = output features, K = input features, G = group size.
    dense_matmul(x, weight)                              W = weight [N, K] in x's dtype
    int8_matmul(x, qweight, scales, group_size)          W = q * s                 (W8A16)
    int4_matmul(x, qweight, scales, zeros, group_size)   W = (q - z) * s           (W4A16)
    nf4_matmul(x, qweight, absmax)                       W = NF4_CODEBOOK[q] * absmax
    fp8_matmul(x, qweight, weight_scale, input_scale)    W = q * scale, x quantized to fp8 first (W8A8)
    fp8_matmul_quantized(xq, x_scales, qweight, ...)     the same on x quantized already (a fused norm's)
(layouts: kernels/quant_formats.py). y has x's dtype; products and sums in fp32.
Each `<name>_ref` is the same math in plain torch: dequantize in fp32, matmul in fp32, cast to x's dtype
(fp8's reference quantizes the activations as the kernel does).

Dispatch:
- one token: kernels/quant_gemv.py;
- 2..STREAMING_MAX_TOKENS tokens: kernels/quant_gemm.py's weight-streaming tiles, except int4 and nf4 on a GPU,
  which dequantize (below);
- above, on a GPU: int8, int4 and nf4 dequantize the weight whole and take cuBLAS (kernels/quant_dequant.py,
  `dequantizes`); fp8 with per-channel or per-tensor weight scales takes torch._scaled_mm's row-wise scaled
  fp8 GEMM (bf16 output); dense takes F.linear; fp8 with block scales takes kernels/quant_gemm.py's
  tensor-core tiles, which the CPU interpreter takes for every format.
Activations of fp8: per 128-wide group of K where the weight has 128x128 block scales, per token
otherwise, or the static input_scale where the checkpoint gives one.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kernels._launch import check_device
from kernels.fp8_activations import quantize_fp8_activations, quantize_fp8_activations_ref
from kernels.quant_dequant import dequantize
from kernels.quant_formats import (
    FP8_BLOCK,
    NF4_BLOCK,
    NF4_CODEBOOK,
    check_activations,
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    dequantize_nf4,
    fp8_block_scaled,
    fp8_weight_shape,
    int4_weight_shape,
    int8_weight_shape,
    nf4_weight_shape,
)
from kernels.quant_gemm import STREAMING_MAX_TOKENS, _quant_gemm_kernel, launch_quant_gemm
from kernels.quant_gemv import CHUNK_SCALE, DENSE, END_SCALE, FP8, INT4, INT8, NF4

__all__ = [
    "NF4_CODEBOOK",
    "dense_matmul",
    "dense_matmul_ref",
    "fp8_activation_group",
    "fp8_matmul",
    "fp8_matmul_quantized",
    "fp8_matmul_quantized_ref",
    "fp8_matmul_ref",
    "int4_matmul",
    "int4_matmul_ref",
    "int8_matmul",
    "int8_matmul_ref",
    "nf4_matmul",
    "nf4_matmul_ref",
    "quantize_fp8_activations",
    "quantize_fp8_activations_ref",
    "supports_fp8",
]


@functools.lru_cache(maxsize=8)
def _codebook(device: torch.device) -> torch.Tensor:
    return torch.tensor(NF4_CODEBOOK, dtype=torch.float32, device=device)


def dequantizes(x: torch.Tensor, four_bit: bool) -> bool:
    """Whether a weight-only format's matmul dequantizes its weight whole and hands it to cuBLAS
    (kernels/quant_dequant.py), on a GPU: int8 above STREAMING_MAX_TOKENS tokens (where the matmul is bound
    by its FLOPs); int4 and nf4 from 2 tokens, because kernels/quant_gemm.py's 4-bit streaming tiles ran at
    1-3 % of their floor on the H200 (2026-11-29, decision 0070). The interpreter keeps the Triton tiles (the
    CPU tests' path for them)."""
    return x.device.type == "cuda" and x.shape[0] > (1 if four_bit else STREAMING_MAX_TOKENS)


def dense_matmul(x: torch.Tensor, weight: torch.Tensor, *, tiles: dict | None = None) -> torch.Tensor:
    """x [M, K] weight[N, K]^T: the streaming kernel up to STREAMING_MAX_TOKENS tokens, F.linear above."""
    if weight.dim() != 2 or weight.dtype != x.dtype:
        raise ValueError(f"weight must be [N, K] of x's dtype {x.dtype}, got {list(weight.shape)} {weight.dtype}")
    check_activations(x, weight.shape[1])
    if weight.stride(1) != 1 and weight.shape[1] > 1:
        raise ValueError(f"weight must be contiguous in its last dim, got strides {weight.stride()}")
    check_device(_quant_gemm_kernel, "x and weight", x, weight)
    if x.shape[0] > STREAMING_MAX_TOKENS and tiles is None:
        return F.linear(x, weight)
    return launch_quant_gemm(x, weight, weight.shape[0], DENSE, x.dtype, tiles=tiles)


def dense_matmul_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.float() @ weight.float().t()).to(x.dtype)


def int8_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int, *, tiles: dict | None = None
) -> torch.Tensor:
    num_out, num_in = int8_weight_shape(qweight, scales, group_size)
    check_activations(x, num_in)
    check_device(_quant_gemm_kernel, "x, qweight and scales", x, qweight, scales)
    # NOTE: one scale a row multiplies the accumulated sum (the codes, exact in bf16, go into the dot as they are)
    scale_at = END_SCALE if group_size == num_in else CHUNK_SCALE
    if tiles is None and dequantizes(x, four_bit=False):
        return F.linear(x, dequantize(qweight, INT8, num_in, scales, group_size, x.dtype))
    return launch_quant_gemm(
        x, qweight, num_out, INT8, x.dtype, w_scales=scales, w_scale_at=scale_at, w_group=group_size, tiles=tiles
    )


def int8_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    int8_weight_shape(qweight, scales, group_size)
    return (x.float() @ dequantize_int8(qweight, scales, group_size).t()).to(x.dtype)


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    *,
    tiles: dict | None = None,
) -> torch.Tensor:
    num_out, num_in = int4_weight_shape(qweight, scales, zeros, group_size)
    check_activations(x, num_in)
    extra = [zeros] if zeros is not None else []
    check_device(_quant_gemm_kernel, "x, qweight, scales and zeros", x, qweight, scales, *extra)
    if tiles is None and dequantizes(x, four_bit=True):
        return F.linear(x, dequantize(qweight, INT4, num_in, scales, group_size, x.dtype, zeros=zeros))
    return launch_quant_gemm(
        x, qweight, num_out, INT4, x.dtype, w_scales=scales, w_scale_at=CHUNK_SCALE, w_group=group_size,
        zeros=zeros, tiles=tiles,
    )  # fmt: skip


def int4_matmul_ref(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    int4_weight_shape(qweight, scales, zeros, group_size)
    return (x.float() @ dequantize_int4(qweight, scales, zeros, group_size).t()).to(x.dtype)


def nf4_matmul(
    x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, *, tiles: dict | None = None
) -> torch.Tensor:
    num_out, num_in = nf4_weight_shape(qweight, absmax)
    check_activations(x, num_in)
    check_device(_quant_gemm_kernel, "x, qweight and absmax", x, qweight, absmax)
    if tiles is None and dequantizes(x, four_bit=True):
        codebook = _codebook(x.device)
        return F.linear(x, dequantize(qweight, NF4, num_in, absmax, NF4_BLOCK, x.dtype, codebook=codebook))
    return launch_quant_gemm(
        x, qweight, num_out, NF4, x.dtype, w_scales=absmax, w_scale_at=CHUNK_SCALE, w_group=NF4_BLOCK,
        codebook=_codebook(x.device), tiles=tiles,
    )  # fmt: skip


def nf4_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    nf4_weight_shape(qweight, absmax)
    return (x.float() @ dequantize_nf4(qweight, absmax).t()).to(x.dtype)


def _fp8_activations(x, qweight, weight_scale, input_scale, quantize):
    """x quantized as fp8_matmul's weight asks: (xq, scales, per-128-group?)."""
    if input_scale is not None:
        return (*quantize(x, None, input_scale=input_scale), False)
    grouped = fp8_block_scaled(qweight, weight_scale)
    return (*quantize(x, FP8_BLOCK if grouped else None), grouped)


FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper: e4m3 conversions and tensor-core products


def supports_fp8(device: torch.device) -> bool:
    """Whether fp8_matmul runs on `device`: a GPU of compute capability 8.9 or newer, or the CPU
    interpreter (which widens the codes to fp32)."""
    if device.type != "cuda":
        return True
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= FP8_MIN_CAPABILITY


@functools.lru_cache(maxsize=8)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)  # looked up once: fp8_matmul asks on every call


def uses_scaled_mm(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Whether fp8_matmul takes torch._scaled_mm: a GPU, more than STREAMING_MAX_TOKENS tokens, weight
    scales per channel or per tensor, bf16 output and the 16-multiples its fp8 GEMM needs (x: the
    activations, or their fp8 codes with the output dtype checked by the caller)."""
    num_out, num_in = qweight.shape
    return (
        x.device.type == "cuda"
        and x.shape[0] > STREAMING_MAX_TOKENS
        and x.dtype in (torch.bfloat16, torch.float8_e4m3fn)
        and not fp8_block_scaled(qweight, weight_scale)
        and num_out % 16 == 0
        and num_in % 16 == 0
    )


def _check_fp8_device(x: torch.Tensor, qweight, weight_scale, input_scale) -> None:
    extra = [input_scale] if input_scale is not None else []
    check_device(_quant_gemm_kernel, "x, qweight, weight_scale and input_scale", x, qweight, weight_scale, *extra)
    if not supports_fp8(x.device):
        raise ValueError(
            f"fp8_matmul needs a GPU of compute capability >= 8.9, {x.device} has "
            f"{torch.cuda.get_device_capability(x.device)}: quantize the weights to int8 instead"
        )


def fp8_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    *,
    tiles: dict | None = None,
) -> torch.Tensor:
    num_out, num_in = fp8_weight_shape(qweight, weight_scale)
    check_activations(x, num_in)
    _check_fp8_device(x, qweight, weight_scale, input_scale)
    xq, x_scales, grouped = _fp8_activations(x, qweight, weight_scale, input_scale, quantize_fp8_activations)
    return _fp8_matmul_codes(xq, x_scales, grouped, qweight, weight_scale, x.dtype, tiles)


def fp8_activation_group(qweight: torch.Tensor, weight_scale: torch.Tensor) -> int | None:
    """The group along K of the activations' dynamic scales that an fp8 weight asks for: FP8_BLOCK for
    128x128 block scales, None (per token) otherwise."""
    return FP8_BLOCK if fp8_block_scaled(qweight, weight_scale) else None


def fp8_matmul_quantized(
    xq: torch.Tensor,
    x_scales: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    tiles: dict | None = None,
) -> torch.Tensor:
    """fp8_matmul on activations quantized already (kernels/rms_norm_fp8.py): xq [M, K] float8_e4m3fn with
    their dynamic scales, [M, ceil(K / 128)] for block-scaled weights (fp8_activation_group) or [M, 1]."""
    num_out, num_in = fp8_weight_shape(qweight, weight_scale)
    if xq.dtype != torch.float8_e4m3fn or xq.dim() != 2 or xq.shape[1] != num_in or not xq.is_contiguous():
        raise ValueError(f"xq must be contiguous float8_e4m3fn [M, K={num_in}], got {list(xq.shape)} {xq.dtype}")
    group = fp8_activation_group(qweight, weight_scale)
    groups = 1 if group is None else -(-num_in // group)
    if x_scales.dtype != torch.float32 or tuple(x_scales.shape) != (xq.shape[0], groups):
        raise ValueError(
            f"x_scales must be float32 [{xq.shape[0]}, {groups}] for this weight, "
            f"got {list(x_scales.shape)} {x_scales.dtype}"
        )
    if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    _check_fp8_device(xq, qweight, weight_scale, x_scales)
    return _fp8_matmul_codes(xq, x_scales, group is not None, qweight, weight_scale, out_dtype, tiles)


def _fp8_matmul_codes(xq, x_scales, grouped: bool, qweight, weight_scale, out_dtype, tiles) -> torch.Tensor:
    """The fp8 product of codes and their scales (grouped: per 128 columns, else one a token or the static one)."""
    num_out = qweight.shape[0]
    if tiles is None and out_dtype == torch.bfloat16 and uses_scaled_mm(xq, qweight, weight_scale):
        # NOTE: row-wise scaling wants both scales as vectors: [M, 1] and [1, N]
        scale_a = x_scales.expand(xq.shape[0], 1).contiguous()
        scale_b = weight_scale.reshape(1, -1).expand(1, num_out).contiguous()
        return torch._scaled_mm(xq, qweight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    block = fp8_block_scaled(qweight, weight_scale)
    return launch_quant_gemm(
        xq, qweight, num_out, FP8, out_dtype,
        w_scales=weight_scale, w_scale_at=CHUNK_SCALE if block else END_SCALE, w_group=FP8_BLOCK,
        w_row_div=FP8_BLOCK if block else 1,
        x_scales=x_scales, x_scale_at=CHUNK_SCALE if grouped else END_SCALE, tiles=tiles,
    )  # fmt: skip


def fp8_matmul_ref(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None = None
) -> torch.Tensor:
    num_out, num_in = fp8_weight_shape(qweight, weight_scale)
    check_activations(x, num_in)
    xq, x_scales, grouped = _fp8_activations(x, qweight, weight_scale, input_scale, quantize_fp8_activations_ref)
    if grouped:
        x_scales = x_scales.repeat_interleave(FP8_BLOCK, dim=1)[:, :num_in]
    xd = xq.float() * x_scales
    return (xd @ dequantize_fp8(qweight, weight_scale).t()).to(x.dtype)


def fp8_matmul_quantized_ref(
    xq: torch.Tensor, x_scales: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    num_out, num_in = fp8_weight_shape(qweight, weight_scale)
    spread = x_scales
    if fp8_activation_group(qweight, weight_scale) is not None:
        spread = x_scales.repeat_interleave(FP8_BLOCK, dim=1)[:, :num_in]
    return ((xq.float() * spread) @ dequantize_fp8(qweight, weight_scale).t()).to(out_dtype)
