"""Building a model whose linear layers are quantized: the scheme their constructor reads, the check that
every layer fits it, and dummy weights.

Why a context rather than an argument: the linear layers are built deep inside every model family's
constructor (attention, MLP, fused projections); the scheme is one per model, like the default device and
dtype the loader already sets around construction (engine/model_loader.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import nn

from engine.quantization.quantized_weight import QuantizedWeight
from engine.quantization.scheme import QuantScheme

_linear_scheme: ContextVar[QuantScheme | None] = ContextVar("linear_scheme", default=None)


@contextlib.contextmanager
def quantized_linears(scheme: QuantScheme | None) -> Iterator[None]:
    """Linear layers built inside hold QuantizedWeight of `scheme` (None: dense weights)."""
    token = _linear_scheme.set(scheme)
    try:
        yield
    finally:
        _linear_scheme.reset(token)


def linear_scheme() -> QuantScheme | None:
    return _linear_scheme.get()


def check_quantized_model(model: nn.Module, setting: str) -> None:
    """Raises ValueError naming the first layer the scheme cannot hold, or MoE experts (their grouped GEMMs
    take dense weights only). setting: what chose the quantization, for the message."""
    from engine.models.layers.fused_moe import FusedMoE  # the layers import this module

    for name, module in model.named_modules():
        if isinstance(module, FusedMoE):
            raise ValueError(f"{setting}: quantized MoE experts are not supported ({name} of {type(model).__name__})")
        if isinstance(module, QuantizedWeight) and module.problem is not None:
            raise ValueError(f"{setting}: layer {name.removesuffix('.quant')}: {module.problem}")


@torch.no_grad()
def initialize_dummy_quantized(model: nn.Module, seed: int) -> None:
    """Random quantized weights in every quantized layer, reproducibly for a seed and device."""
    generator: torch.Generator | None = None
    for module in model.modules():
        if isinstance(module, QuantizedWeight) and module.qweight.device.type != "meta":
            if generator is None:
                generator = torch.Generator(device=module.qweight.device).manual_seed(seed + 1)
            module.fill_random(generator)
