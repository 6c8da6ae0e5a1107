"""The in-memory layouts of quantized linear weights, their checks and their plain-torch dequantization.

Legend: N = output features, K = input features, G = group size along K.
A linear layer computes y [M, N] = x [M, K] W^T with W logically [N, K]:
    int8 (W8A16): qweight int8 [N, K], scales fp32 [N, K / G]                     w = q * s
    int4 (W4A16): qweight uint8 [N, K / 2] (k = 2j in byte j's low nibble, k = 2j + 1 in its high one),
                  scales fp32 [N, K / G], zeros uint8 [N, K / G] (0..15) or None (zero point 8)
                                                                                  w = (q - z) * s
    nf4:          qweight uint8 [N, K / 2] (same nibble order), absmax fp32 [N, K / 64]
                                                                                  w = NF4_CODEBOOK[q] * absmax
    fp8 (W8A8):   qweight float8_e4m3fn [N, K], weight_scale fp32 [ceil(N/128), ceil(K/128)] (128x128
                  blocks), [N, 1] (per channel) or [1, 1] (per tensor)            w = q * scale
Per-channel int8/int4 is G = K (scales [N, 1]). Every layout keeps W's [N, K] row order, so a row's
codes and its scales sit together and a kernel streams rows along K (kernels/quant_gemm.py).

Why these layouts: they are what the checkpoints' loaders can produce without a second copy (AWQ and GPTQ
unpack to int4 codes of one row per output feature; bitsandbytes' NF4 and the FP8 checkpoints already are
row-major [N, K]), and one layout per format keeps the kernels to one code path each (decision
0055-quantized-gemm-kernels).
"""

from __future__ import annotations

import torch

# bitsandbytes' NormalFloat4: the 16 quantiles of N(0, 1) scaled to [-1, 1], zero exact (code 7)
NF4_CODEBOOK = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)
NF4_BLOCK = 64  # absmax block along K
FP8_BLOCK = 128  # weight-scale block (both dims) and activation group of block-scaled FP8
FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT4_GROUP_SIZES = (32, 64, 128)
INT4_SYMMETRIC_ZERO = 8


def check_activations(x: torch.Tensor, num_in: int) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != num_in:
        raise ValueError(f"x must be [M, K={num_in}], got {tuple(x.shape)}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"x must be contiguous in its last dim, got strides {x.stride()}")


def check_group_size(group_size: int, num_in: int, allowed: tuple[int, ...]) -> None:
    if group_size != num_in and group_size not in allowed:
        raise ValueError(f"group_size must be one of {allowed} or K={num_in}, got {group_size}")
    if num_in % group_size:
        raise ValueError(f"group_size {group_size} does not divide K={num_in}")


def check_tensor(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"{name} must be {list(shape)} {dtype}, got {list(t.shape)} {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def int8_weight_shape(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> tuple[int, int]:
    """(N, K) of an int8 weight, after checking qweight, scales and group_size against each other."""
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be int8 [N, K], got {list(qweight.shape)} {qweight.dtype}")
    num_out, num_in = qweight.shape
    check_group_size(group_size, num_in, (32, 64, 128))
    check_tensor("qweight", qweight, (num_out, num_in), torch.int8)
    check_tensor("scales", scales, (num_out, num_in // group_size), torch.float32)
    return num_out, num_in


def int4_weight_shape(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int
) -> tuple[int, int]:
    """(N, K) of a packed int4 weight, after checking qweight, scales, zeros and group_size."""
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be uint8 [N, K / 2], got {list(qweight.shape)} {qweight.dtype}")
    num_out, num_in = qweight.shape[0], 2 * qweight.shape[1]
    check_group_size(group_size, num_in, INT4_GROUP_SIZES)
    check_tensor("qweight", qweight, (num_out, num_in // 2), torch.uint8)
    check_tensor("scales", scales, (num_out, num_in // group_size), torch.float32)
    if zeros is not None:
        check_tensor("zeros", zeros, (num_out, num_in // group_size), torch.uint8)
    return num_out, num_in


def nf4_weight_shape(qweight: torch.Tensor, absmax: torch.Tensor) -> tuple[int, int]:
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be uint8 [N, K / 2], got {list(qweight.shape)} {qweight.dtype}")
    num_out, num_in = qweight.shape[0], 2 * qweight.shape[1]
    if num_in % NF4_BLOCK:
        raise ValueError(f"nf4 needs K a multiple of {NF4_BLOCK} (its absmax block), got K={num_in}")
    check_tensor("qweight", qweight, (num_out, num_in // 2), torch.uint8)
    check_tensor("absmax", absmax, (num_out, num_in // NF4_BLOCK), torch.float32)
    return num_out, num_in


def fp8_weight_shape(qweight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[int, int]:
    if qweight.dtype != torch.float8_e4m3fn or qweight.dim() != 2:
        raise ValueError(f"qweight must be float8_e4m3fn [N, K], got {list(qweight.shape)} {qweight.dtype}")
    num_out, num_in = qweight.shape
    check_tensor("qweight", qweight, (num_out, num_in), torch.float8_e4m3fn)
    blocks = (-(-num_out // FP8_BLOCK), -(-num_in // FP8_BLOCK))
    allowed = {blocks, (num_out, 1), (1, 1)}
    if weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) not in allowed:
        raise ValueError(
            f"weight_scale must be float32 {list(blocks)} (128x128 blocks), [{num_out}, 1] (per channel) or "
            f"[1, 1] (per tensor), got {list(weight_scale.shape)} {weight_scale.dtype}"
        )
    if not weight_scale.is_contiguous():
        raise ValueError(f"weight_scale must be contiguous, got strides {weight_scale.stride()}")
    return num_out, num_in


def fp8_block_scaled(qweight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Whether an fp8 weight has 128x128 block scales (its activations then take per-128-group scales).

    NOTE: a weight of at most 128 rows has blocks of the per-tensor shape [1, 1] (and of the per-channel
    shape [N, 1] at N <= 128 with K <= 128); both readings give the same w, the per-channel and per-tensor
    ones are taken, so such a weight's activations are quantized per token."""
    num_out, num_in = qweight.shape
    shape = tuple(weight_scale.shape)
    return shape not in ((1, 1), (num_out, 1)) and shape == (-(-num_out // FP8_BLOCK), -(-num_in // FP8_BLOCK))


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] -> the codes int32 [N, K] (k = 2j from byte j's low nibble, 2j + 1 from its high)."""
    low = (qweight & 0xF).to(torch.int32)
    high = (qweight >> 4).to(torch.int32)
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], -1)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int codes [N, K] in 0..15 (K even) -> uint8 [N, K / 2] in the layout unpack_int4 reads."""
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 [N, K] = q * s."""
    return qweight.float() * scales.repeat_interleave(group_size, dim=1)


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """fp32 [N, K] = (q - z) * s, z = 8 without zeros."""
    codes = unpack_int4(qweight).float()
    zero = INT4_SYMMETRIC_ZERO if zeros is None else zeros.float().repeat_interleave(group_size, dim=1)
    return (codes - zero) * scales.repeat_interleave(group_size, dim=1)


def dequantize_nf4(qweight: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] = NF4_CODEBOOK[q] * absmax."""
    codebook = torch.tensor(NF4_CODEBOOK, dtype=torch.float32, device=qweight.device)
    return codebook[unpack_int4(qweight).long()] * absmax.repeat_interleave(NF4_BLOCK, dim=1)


def dequantize_fp8(qweight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] = q * scale, the scale broadcast over its block, row or the whole tensor."""
    num_out, num_in = qweight.shape
    scale = weight_scale
    if fp8_block_scaled(qweight, weight_scale):
        scale = scale.repeat_interleave(FP8_BLOCK, dim=0)[:num_out].repeat_interleave(FP8_BLOCK, dim=1)[:, :num_in]
    return qweight.float() * scale


def random_quantized_weight(
    fmt: str, num_out: int, num_in: int, group_size: int | None, device: torch.device, *, zeros: bool = False
) -> dict:
    """Random codes and scales of one layout, sized so that y = x W^T keeps x's scale (tests, benchmarks):
    the keyword arguments of the format's matmul after x. fmt: int8, int4, nf4, fp8_block, fp8_channel,
    fp8_tensor; group_size: int8/int4's (None: per channel)."""
    g = torch.Generator().manual_seed(num_out * 7919 + num_in)
    group = num_in if group_size is None else group_size
    unit = num_in**-0.5
    if fmt == "int8":
        qweight = torch.randint(-127, 128, (num_out, num_in), generator=g, dtype=torch.int8)
        scales = (torch.rand(num_out, num_in // group, generator=g) + 0.5) * unit / 73
        return {"qweight": qweight.to(device), "scales": scales.to(device), "group_size": group}
    if fmt in ("int4", "nf4"):
        qweight = pack_int4(torch.randint(0, 16, (num_out, num_in), generator=g)).to(device)
        if fmt == "nf4":
            absmax = (torch.rand(num_out, num_in // NF4_BLOCK, generator=g) + 0.5) * unit * 1.8
            return {"qweight": qweight, "absmax": absmax.to(device)}
        scales = ((torch.rand(num_out, num_in // group, generator=g) + 0.5) * unit / 4.6).to(device)
        zero_points = torch.randint(6, 11, (num_out, num_in // group), generator=g, dtype=torch.uint8)
        return {
            "qweight": qweight,
            "scales": scales,
            "zeros": zero_points.to(device) if zeros else None,
            "group_size": group,
        }
    shapes = {
        "fp8_block": (-(-num_out // FP8_BLOCK), -(-num_in // FP8_BLOCK)),
        "fp8_channel": (num_out, 1),
        "fp8_tensor": (1, 1),
    }
    if fmt not in shapes:
        raise ValueError(f"fmt must be int8, int4, nf4 or one of {sorted(shapes)}, got {fmt!r}")
    qweight = (torch.randn(num_out, num_in, generator=g) * 64).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    weight_scale = (torch.rand(*shapes[fmt], generator=g) + 0.5) * unit / 64
    return {"qweight": qweight.to(device), "weight_scale": weight_scale.to(device)}
