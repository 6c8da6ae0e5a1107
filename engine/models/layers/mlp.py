"""The gated (SwiGLU) MLP of Llama-like models: down(silu(gate(x)) * up(x)).

Legend: T = tokens, H = hidden, I = intermediate size.
"""

from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.models.layers.linear import Linear, gate_up_linear


class GatedMLP(nn.Module):
    """Args: hidden_size H, intermediate_size I, bias (the config's mlp_bias)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_linear(hidden_size, intermediate_size, bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        return self.down_proj(ops.silu_and_mul(gate_up))  # [T, I] -> [T, H]
