"""compressed-tensors -> the int4, int8 or fp8 layout.

pack-quantized: weight_packed int32 [N, K / (32 / b)], 32 / b codes along K a word (the first in the
    lowest bits), each stored as the signed code plus 2^(b-1); weight_scale [N, K / G] (or [N, 1] per
    channel); weight_zero_point int32 [ceil(N / (32 / b)), K / G] packed the same way along N (asymmetric
    only); weight_shape [2] = (N, K). w = (q - z) * s with q and z signed.
int-quantized: weight int8 [N, K], weight_scale as above. w = q * s.
float-quantized: weight float8_e4m3fn [N, K], weight_scale [N, 1] (channel) or one value (tensor),
    input_scale one value (static activations).
In the int4 layout the stored codes are the unsigned ones (q + 8), so the layout's implied zero point of 8
is the symmetric scheme's zero, and an asymmetric zero point z is stored as z + 8.
"""

from __future__ import annotations

import torch

from engine.quantization.checkpoint_config import CheckpointQuantization
from engine.quantization.packed_tensors import PackedTensors, expect_shape, groups_of, unpack_int32
from kernels.quant_formats import pack_int4

PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight", "input_scale", "weight_g_idx")
FIELD = "quantization_config.config_groups.*.weights.group_size"


def required_parts(quant: CheckpointQuantization) -> tuple[str, ...]:
    if quant.packing == "pack-quantized":
        return ("weight_packed", "weight_scale", "weight_shape") + (
            ("weight_zero_point",) if quant.scheme.zeros else ()
        )
    if quant.packing == "int-quantized":
        return ("weight", "weight_scale")
    return ("weight", "weight_scale") + (("input_scale",) if quant.scheme.static_input else ())


def repack(prefix: str, parts: dict[str, torch.Tensor], quant: CheckpointQuantization) -> PackedTensors:
    if "weight_g_idx" in parts:
        raise ValueError(f"checkpoint tensor {prefix + '.weight_g_idx'!r}: act-order weights are not supported")
    if quant.packing == "float-quantized":
        return _float(prefix, parts, quant)
    if quant.packing == "int-quantized":
        qweight = parts["weight"]
        num_out, num_in = qweight.shape
        groups = groups_of(f"{prefix}.weight", num_in, quant.scheme.group_size, FIELD)
        expect_shape(f"{prefix}.weight_scale", parts["weight_scale"], (num_out, groups), "[N, K / group_size]")
        tensors = {"qweight": qweight.to(torch.int8).contiguous(), "scales": parts["weight_scale"].float().contiguous()}
        return PackedTensors(f"{prefix}.weight", "int8", tensors, num_in // groups)
    return _packed(prefix, parts, quant)


def _packed(prefix: str, parts: dict[str, torch.Tensor], quant: CheckpointQuantization) -> PackedTensors:
    bits, per_word = quant.bits, 32 // quant.bits
    num_out, num_in = (int(v) for v in parts["weight_shape"].tolist())
    expect_shape(f"{prefix}.weight_packed", parts["weight_packed"], (num_out, -(-num_in // per_word)),
                 f"[N, K / {per_word}] of weight_shape {[num_out, num_in]}")  # fmt: skip
    groups = groups_of(f"{prefix}.weight_packed", num_in, quant.scheme.group_size, FIELD)
    expect_shape(f"{prefix}.weight_scale", parts["weight_scale"], (num_out, groups), "[N, K / group_size]")
    codes = unpack_int32(parts["weight_packed"].to(torch.int32), bits, dim=1)[:, :num_in]  # [N, K] unsigned
    scales = parts["weight_scale"].float().contiguous()
    group = num_in // groups
    if bits == 8:
        return PackedTensors(f"{prefix}.weight", "int8", {"qweight": (codes - 128).to(torch.int8), "scales": scales},
                             group)  # fmt: skip
    tensors = {"qweight": pack_int4(codes), "scales": scales}
    if quant.scheme.zeros:
        packed_zeros = parts["weight_zero_point"]
        expect_shape(f"{prefix}.weight_zero_point", packed_zeros, (-(-num_out // per_word), groups),
                     f"[N / {per_word}, K / group_size]")  # fmt: skip
        zeros = unpack_int32(packed_zeros.to(torch.int32), bits, dim=0)[:num_out]  # signed zero + 8
        tensors["zeros"] = zeros.to(torch.uint8).contiguous()
    return PackedTensors(f"{prefix}.weight", "int4", tensors, group)


def _float(prefix: str, parts: dict[str, torch.Tensor], quant: CheckpointQuantization) -> PackedTensors:
    return fp8_tensors(prefix, parts["weight"], parts["weight_scale"], parts.get("input_scale"), quant)


def fp8_tensors(
    prefix: str,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None,
    quant: CheckpointQuantization,
    scale_name: str = "weight_scale",
) -> PackedTensors:
    """An fp8 weight and its scales in the layout: per-tensor scales widened to one per row (so fused
    projections whose parts have different scales stay one weight)."""
    if qweight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"checkpoint tensor {prefix + '.weight'!r} is {qweight.dtype}, expected float8_e4m3fn")
    num_out, num_in = qweight.shape
    name = f"{prefix}.{scale_name}"
    if quant.scheme.fp8_scales == "block":
        blocks = (-(-num_out // 128), -(-num_in // 128))
        expect_shape(name, weight_scale, blocks, "[ceil(N / 128), ceil(K / 128)] of weight_block_size [128, 128]")
        scale = weight_scale.float().contiguous()
    elif weight_scale.numel() == 1:
        scale = weight_scale.float().reshape(1, 1).expand(num_out, 1).contiguous()
    else:
        expect_shape(name, weight_scale, (num_out, 1), "[N, 1] per channel, or one value per tensor")
        scale = weight_scale.float().contiguous()
    tensors = {"qweight": qweight.contiguous(), "weight_scale": scale}
    if quant.scheme.static_input:
        if input_scale is None or input_scale.numel() != 1:
            shape = None if input_scale is None else list(input_scale.shape)
            raise ValueError(f"checkpoint tensor {prefix + '.input_scale'!r} must hold one value, got {shape}")
        tensors["input_scale"] = input_scale.float().reshape(1, 1)
    return PackedTensors(f"{prefix}.weight", "fp8", tensors)
