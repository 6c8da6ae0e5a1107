"""The sparse MLP block of MoE decoder layers, after its pre-norm: router, routed experts, and the
optional shared expert of Qwen2-MoE.

Legend: T = tokens, H = hidden size, I = an expert's intermediate size, K = experts per token.

    n = norm(x + residual)
    y = experts(n; top-k of softmax(gate(n)))  [+ sigmoid(shared_expert_gate(n)) * shared_expert(n)]
"""

from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.models.layers.fused_moe import FusedMoE, TopKRouter
from engine.models.layers.linear import Linear, gate_up_linear
from engine.models.layers.norm import RMSNorm
from engine.models.moe_spec import MoESpec


class SharedExpert(nn.Module):
    """A dense SwiGLU MLP every token goes through (Qwen2-MoE's `shared_expert`): down(silu(gate(n)) * up(n))."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_linear(hidden_size, intermediate_size)
        # a partial sum on a tensor-parallel rank: the block adds it to the experts' before one all-reduce
        self.down_proj = Linear(intermediate_size, hidden_size, parallel="row_partial")

    def forward(self, normed: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(normed)))  # [T, H] -> [T, 2I] -> [T, I] -> [T, H]


class SparseMoeBlock(nn.Module):
    """The MoE MLP of one decoder layer; called like GatedMLP: (x, residual, norm) -> (output, residual).

    Args:
        hidden_size: H.
        spec: the checkpoint's experts (engine/models/moe_spec.py).
        checkpoint_names: the per-expert checkpoint's projection names (layers/fused_moe.py).
    """

    def __init__(self, hidden_size: int, spec: MoESpec, checkpoint_names: dict[str, str]) -> None:
        super().__init__()
        self.gate = TopKRouter(spec.num_experts, hidden_size, spec.top_k, spec.renormalize)
        self.experts = FusedMoE(spec.num_experts, hidden_size, spec.intermediate_size, checkpoint_names)
        self.shared_expert: SharedExpert | None = None
        self.shared_expert_gate: Linear | None = None
        if spec.shared_expert_intermediate_size:
            self.shared_expert = SharedExpert(hidden_size, spec.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(hidden_size, 1)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual [T, H] -> (the block's output for norm(x + residual), x + residual)."""
        if residual is None:
            normed, residual = norm(x), x
        else:
            normed, residual = norm(x, residual)
        weights, ids = self.gate(normed)  # [T, K] float32, [T, K] int32
        out = self.experts(normed, weights, ids)  # [T, H]
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            shared = self.shared_expert(normed)  # [T, H]
            out = out + torch.sigmoid(self.shared_expert_gate(normed)) * shared  # gate [T, 1]
        # a tensor-parallel rank's experts hold I / N of each expert: their sum over the group is the output
        return self.experts.tp.all_reduce(out), residual
