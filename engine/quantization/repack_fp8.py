"""quant_method "fp8" (Qwen, DeepSeek and transformers' fine-grained FP8) -> the fp8 layout.

weight float8_e4m3fn [N, K] with weight_scale_inv fp32 [ceil(N/128), ceil(K/128)]: despite its name the
factor that dequantizes (w = q * weight_scale_inv over each 128x128 block). Without a block size:
weight_scale, one value per tensor, and input_scale with static activations.
"""

from __future__ import annotations

import torch

from engine.quantization.checkpoint_config import CheckpointQuantization
from engine.quantization.packed_tensors import PackedTensors
from engine.quantization.repack_compressed import fp8_tensors

PARTS = ("weight", "weight_scale_inv", "weight_scale", "input_scale")


def required_parts(quant: CheckpointQuantization) -> tuple[str, ...]:
    if quant.scheme.fp8_scales == "block":
        return ("weight", "weight_scale_inv")
    return ("weight", "weight_scale") + (("input_scale",) if quant.scheme.static_input else ())


def repack(prefix: str, parts: dict[str, torch.Tensor], quant: CheckpointQuantization) -> PackedTensors:
    if quant.scheme.fp8_scales == "block":
        return fp8_tensors(prefix, parts["weight"], parts["weight_scale_inv"], None, quant, "weight_scale_inv")
    return fp8_tensors(prefix, parts["weight"], parts["weight_scale"], parts.get("input_scale"), quant)
