"""AWQ (GEMM packing) -> the int4 layout.

AWQ stores the transposed weight: qweight int32 [K, N / 8], eight 4-bit codes of eight output columns
a word in the order [0, 2, 4, 6, 1, 3, 5, 7] (lowest bits first); qzeros int32 [K / G, N / 8] packed the
same way; scales fp16 [K / G, N]. w[n, k] = (q - z) * s.
"""

from __future__ import annotations

import torch

from engine.quantization.checkpoint_config import CheckpointQuantization
from engine.quantization.packed_tensors import PackedTensors, expect_shape, groups_of, unpack_int32
from kernels.quant_formats import pack_int4

PARTS = ("qweight", "qzeros", "scales")
# the word's i-th code holds column AWQ_ORDER[i]; column j is code UNDO_ORDER[j]
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
UNDO_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def required_parts(quant: CheckpointQuantization) -> tuple[str, ...]:
    return PARTS


def _columns(packed: torch.Tensor) -> torch.Tensor:
    codes = unpack_int32(packed, 4, dim=1)  # [R, N] in AWQ's order within each word
    return codes.view(codes.shape[0], -1, 8)[:, :, list(UNDO_ORDER)].reshape(codes.shape[0], -1)


def repack(prefix: str, parts: dict[str, torch.Tensor], quant: CheckpointQuantization) -> PackedTensors:
    qweight, qzeros, scales = (parts[p] for p in PARTS)
    num_in, num_out = qweight.shape[0], qweight.shape[1] * 8
    groups = groups_of(f"{prefix}.qweight", num_in, quant.scheme.group_size, "quantization_config.group_size")
    expect_shape(f"{prefix}.scales", scales, (groups, num_out), "[K / group_size, N]")
    expect_shape(f"{prefix}.qzeros", qzeros, (groups, num_out // 8), "[K / group_size, N / 8]")
    codes = _columns(qweight.to(torch.int32)).t()  # [N, K]
    zeros = _columns(qzeros.to(torch.int32)).t().to(torch.uint8).contiguous()  # [N, K / G]
    packed = pack_int4(codes)
    tensors = {"qweight": packed, "scales": scales.float().t().contiguous(), "zeros": zeros}
    return PackedTensors(f"{prefix}.weight", "int4", tensors, num_in // groups)
