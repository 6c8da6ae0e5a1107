"""Random weights for benchmarks: any supported architecture from config.json alone.

Scaled so activations keep unit size through the network (and sampling sees ordinary
logits, not overflow): matrices ~ N(0, 1/fan_in), norm weights 1, biases 0.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def initialize_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Fills every parameter of `model` in place, reproducibly for a seed and device.

    Parameters on the meta device are left alone (shape checks build models there).
    """
    generator: torch.Generator | None = None
    for name, param in model.named_parameters():
        if param.device.type == "meta":
            continue
        if generator is None:
            generator = torch.Generator(device=param.device).manual_seed(seed)
        if param.dim() == 1:
            param.fill_(0.0 if name.endswith("bias") else 1.0)
            continue
        # [out, in], or [E, out, in] for packed experts: unit-variance outputs for unit-variance inputs
        std = param.shape[-1] ** -0.5
        # NOTE: sampled in fp32 so the same seed gives the same weights (rounded) in every dtype.
        sample = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        param.copy_(sample.normal_(0.0, std, generator=generator))
