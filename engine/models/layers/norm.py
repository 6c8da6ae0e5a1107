"""Normalisation modules; the math lives in engine.ops (kernel or torch reference)."""

from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.models.layers.linear import Linear


class RMSNorm(nn.Module):
    """RMSNorm with an optional fused residual add.

    `norm(x)` returns rms_norm(x); `norm(x, residual)` returns
    (rms_norm(x + residual), x + residual), so a decoder layer carries the residual
    stream without a separate add kernel.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def project(
        self, x: torch.Tensor, residual: torch.Tensor | None, proj: Linear, *, swiglu: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(proj(norm(x + residual)), x + residual); silu(gate) * up of a gate|up proj with swiglu.

        The norm of a pre-norm block and the projection that reads it, as one op: at one token
        they run as one kernel (engine.ops.rms_norm_linear), elsewhere as the norm and a matmul.
        """
        if proj.quant is not None:  # the fused one-token kernels read dense weights: norm and matmul apart
            if proj.quant.fuses_norm(x) and proj.parallel not in ("row", "row_partial"):
                # W8A8 fp8: the norm writes the fp8 activations (no quantization kernel of its own)
                y, residual = proj.quant.norm_project(x, residual, self.weight, self.eps)
                y = y if proj.bias is None else y + proj.bias
            else:
                normed, residual = self(x, residual) if residual is not None else (self(x), x)
                y = proj(normed)
            return (ops.silu_and_mul(y) if swiglu else y), residual
        return ops.rms_norm_linear(x, residual, self.weight, self.eps, proj.weight, proj.bias, swiglu=swiglu)


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (GPT-2)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)
