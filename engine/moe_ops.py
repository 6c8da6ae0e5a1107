"""Where an MoE layer's router and routed experts choose, per call, their Triton kernels
(kernels/moe_router.py, kernels/fused_moe.py) or the torch references; the choice follows engine/ops.py's
process-wide kernel backend (`use_triton`). The layers are engine/models/layers/fused_moe.py's.

Legend: T = tokens, H = hidden size, E = experts, I = an expert's intermediate size, K = experts per token.
"""

from __future__ import annotations

import torch

from engine.ops import use_triton
from kernels.fused_moe import fused_experts_ref
from kernels.moe_router import moe_route_ref


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, K] float32, expert ids [T, K] int32): softmax, top-k and the
    optional renormalization in one kernel (kernels/moe_router.py)."""
    if use_triton(logits):
        from kernels.moe_router import moe_route as kernel

        return kernel(logits, top_k, renormalize)
    return moe_route_ref(logits, top_k, renormalize)


def fused_experts(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """x [T, H] through each token's routed experts (w13 [E, 2I, H], w2 [E, H, I]), weighted and summed
    -> [T, H] (kernels/fused_moe.py). The reference reads expert counts on the host (no CUDA graphs)."""
    if use_triton(x):
        from kernels.fused_moe import fused_experts as kernel

        return kernel(x, w13, w2, weights, ids)
    return fused_experts_ref(x, w13, w2, weights, ids)
