"""The gated (SwiGLU) MLP of Llama-like models, after its pre-norm: down(silu(gate(n)) * up(n)), n = norm(x).

Legend: T = tokens, H = hidden, I = intermediate size.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.layers.linear import Linear, gate_up_linear
from engine.models.layers.norm import RMSNorm


class GatedMLP(nn.Module):
    """Args: hidden_size H, intermediate_size I, bias (the config's mlp_bias)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_linear(hidden_size, intermediate_size, bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias, parallel="row")

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pre-normed MLP: x, residual [T, H] -> (down(swiglu(gate_up(norm(x + residual)))), x + residual).

        The norm, the gate|up projection and SiLU-and-mul are one op (RMSNorm.project): at one token
        one kernel, or two where the SwiGLU runs apart (hidden sizes above 2048, engine.ops says why).
        """
        act, residual = norm.project(x, residual, self.gate_up_proj, swiglu=True)  # [T, I], [T, H]
        return self.down_proj(act), residual  # [T, I] -> [T, H]
