"""A quantized checkpoint's tensors, regrouped: each linear layer's packed parts (qweight, scales, zero
points...) gathered by name prefix and handed on as one PackedTensors under `<prefix>.weight`, in the
layout of kernels/quant_formats.py; every other tensor passes through as it is.

Why a stream: the parts of a layer may sit in different safetensors shards, in any order; a layer is
repacked as soon as its last required part arrives, so at most the layers whose parts straddle a shard
boundary wait on the host, and nothing is repacked on the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import torch

from engine.quantization import repack_awq, repack_compressed, repack_fp8, repack_gptq
from engine.quantization.checkpoint_config import CheckpointQuantization
from engine.quantization.packed_tensors import PackedTensors

REPACKERS: dict[str, ModuleType] = {
    "awq": repack_awq,
    "gptq": repack_gptq,
    "compressed-tensors": repack_compressed,
    "fp8": repack_fp8,
}
# fp8 checkpoints' KV-cache scales: the KV pool stays in the model's dtype, so they are not read
KV_SCALES = ("k_scale", "v_scale", "kv_scale")
PACKED_DTYPES = (torch.int8, torch.float8_e4m3fn)  # a `weight` of these is a layer's codes, not a dense weight


def regroup_quantized(
    weights: Iterator[tuple[str, torch.Tensor]], quant: CheckpointQuantization
) -> Iterator[tuple[str, torch.Tensor | PackedTensors]]:
    """(name, tensor) pairs -> the same, each quantized layer's parts replaced by one (`<prefix>.weight`,
    PackedTensors). Raises ValueError naming a layer whose parts are incomplete or do not fit."""
    repacker = REPACKERS[quant.method]
    required = repacker.required_parts(quant)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    groups_done: dict[str, int | None] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part in KV_SCALES:
            continue
        if part not in repacker.PARTS or (part == "weight" and tensor.dtype not in PACKED_DTYPES):
            yield name, tensor
            continue
        if prefix in groups_done:  # an optional part after its layer was repacked
            if part == "g_idx":
                packed_rows = tensor.shape[0]
                repack_gptq.check_g_idx(name, tensor, packed_rows, groups_done[prefix] or packed_rows)
            elif part == "weight_g_idx":
                raise ValueError(f"checkpoint tensor {name!r}: act-order weights are not supported")
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if all(p in parts for p in required):
            packed = repacker.repack(prefix, pending.pop(prefix), quant)
            groups_done[prefix] = packed.group_size
            yield packed.name, packed
    for prefix, parts in pending.items():
        missing = [f"{prefix}.{p}" for p in required if p not in parts]
        raise ValueError(
            f"checkpoint lacks {', '.join(repr(m) for m in missing)} of the {quant.method} layer with "
            f"{', '.join(repr(f'{prefix}.{p}') for p in sorted(parts))}"
        )
