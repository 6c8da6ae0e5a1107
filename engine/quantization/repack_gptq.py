"""GPTQ (no act-order) -> the int4 or int8 layout.

GPTQ stores qweight int32 [K / (32 / b), N]: 32 / b consecutive input rows a word, the first in the
lowest bits; qzeros int32 [K / G, N / (32 / b)] packed along N; scales fp16 [K / G, N]; g_idx [K] (the
group of each input row: k // G without act-order). Checkpoints of checkpoint_format "gptq" (AutoGPTQ
and most of the Hub) store each zero point minus one; "gptq_v2" stores it as is. w = (q - z) * s.
"""

from __future__ import annotations

import torch

from engine.quantization.checkpoint_config import CheckpointQuantization
from engine.quantization.packed_tensors import PackedTensors, expect_shape, groups_of, to_int8_codes, unpack_int32
from kernels.quant_formats import pack_int4

PARTS = ("qweight", "qzeros", "scales", "g_idx")


def required_parts(quant: CheckpointQuantization) -> tuple[str, ...]:
    return ("qweight", "qzeros", "scales")


def check_g_idx(name: str, g_idx: torch.Tensor, num_in: int, group: int) -> None:
    """Without act-order each input row k is in group k // G; anything else reorders the rows."""
    expect_shape(name, g_idx, (num_in,), "[K]")
    if not torch.equal(g_idx.long(), torch.arange(num_in) // group):
        raise ValueError(
            f"checkpoint tensor {name!r} reorders the input rows (act-order), which quantization_config.desc_act: "
            "false does not allow"
        )


def repack(prefix: str, parts: dict[str, torch.Tensor], quant: CheckpointQuantization) -> PackedTensors:
    bits, per_word = quant.bits, 32 // quant.bits
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    num_in, num_out = qweight.shape[0] * per_word, qweight.shape[1]
    group_size = quant.scheme.group_size
    groups = groups_of(f"{prefix}.qweight", num_in, group_size, "quantization_config.group_size")
    expect_shape(f"{prefix}.scales", scales, (groups, num_out), "[K / group_size, N]")
    expect_shape(f"{prefix}.qzeros", qzeros, (groups, num_out // per_word), f"[K / group_size, N / {per_word}]")
    group = num_in // groups
    if "g_idx" in parts:
        check_g_idx(f"{prefix}.g_idx", parts["g_idx"], num_in, group)
    codes = unpack_int32(qweight.to(torch.int32), bits, dim=0).t()  # [N, K]
    zeros = unpack_int32(qzeros.to(torch.int32), bits, dim=1).t()  # [N, K / G]
    if quant.gptq_zero_offset:
        zeros = (zeros + 1) & ((1 << bits) - 1)
    scales = scales.float().t().contiguous()
    if bits == 8:
        qcodes = to_int8_codes(f"{prefix}.qzeros", codes, zeros, "quantization_config.sym")
        return PackedTensors(f"{prefix}.weight", "int8", {"qweight": qcodes.contiguous(), "scales": scales}, group)
    packed = pack_int4(codes)
    tensors = {"qweight": packed, "scales": scales, "zeros": zeros.to(torch.uint8).contiguous()}
    if not quant.scheme.zeros:  # symmetric: the layout's implied zero point of 8
        if not bool((zeros == 8).all()):
            raise ValueError(
                f"quantization_config.sym: true, but checkpoint tensor {prefix + '.qzeros'!r} has zero points other "
                "than 8"
            )
        del tensors["zeros"]
    return PackedTensors(f"{prefix}.weight", "int4", tensors, group)
