"""Which quantization a model loads with: the checkpoint's `quantization_config`, or the `quantization`
setting (on the fly), never both; FP8 only where the GPU has it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.quantization.checkpoint_config import CheckpointQuantization, parse_quantization_config
from engine.quantization.scheme import QuantScheme, on_the_fly_scheme

FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper: e4m3 conversions and tensor-core products


@dataclass(frozen=True)
class ModelQuantization:
    """Args: scheme (every linear layer's), checkpoint (its packed format; None: quantized on the fly),
    setting (what chose it, for messages)."""

    scheme: QuantScheme
    checkpoint: CheckpointQuantization | None
    setting: str


def select_quantization(hf_config: Any, requested: str | None, device: torch.device) -> ModelQuantization | None:
    """Raises ValueError naming the setting or field: both given, an unsupported config, fp8 on a GPU
    below compute capability 8.9 (refused, not emulated: weight-only int8 is the fallback to choose)."""
    checkpoint = parse_quantization_config(hf_config)
    if checkpoint is not None and requested is not None:
        raise ValueError(
            f"quantization: {requested!r} cannot re-quantize a checkpoint that is already quantized "
            f"(quantization_config.quant_method {checkpoint.method!r}); leave quantization unset"
        )
    if checkpoint is not None:
        chosen = ModelQuantization(checkpoint.scheme, checkpoint, f"quantization_config ({checkpoint.method})")
    elif requested is not None:
        chosen = ModelQuantization(on_the_fly_scheme(requested), None, f"quantization {requested!r}")
    else:
        return None
    if chosen.scheme.fmt == "fp8" and device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_MIN_CAPABILITY:
            raise ValueError(
                f"{chosen.setting}: fp8 needs a GPU of compute capability 8.9 or newer, {device} has "
                f"{capability[0]}.{capability[1]}; use quantization 'int8' (weight-only) on this GPU"
            )
    return chosen
