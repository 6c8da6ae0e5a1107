"""The routed experts and their router, as layers: packed expert weights, one op for all experts.

Legend: T = tokens, H = hidden size, E = experts, I = an expert's intermediate size, K = experts per token.

Every expert's gate and up projections live in ONE parameter, `gate_up_proj` [E, 2I, H] (rows: the
gate's I, then the up's I), and every down projection in `down_proj` [E, H, I]: the names, shapes and
order transformers 5 uses for its packed experts, so a packed checkpoint loads tensor for tensor and a
per-expert one (`experts.{e}.gate_proj.weight`, Mixtral's `experts.{e}.w1.weight`, ...) slice by slice
(engine/models/loading.py). One parameter per projection is what one grouped kernel launch reads.

On a tensor-parallel rank every expert keeps I / N of its intermediate rows (gate and up rows, down columns):
the experts' outputs are partial sums, which the MoE block adds over the group once (decision 0061).
"""

from __future__ import annotations

import torch
from torch import nn

from engine import moe_ops, ops
from engine.parallel.group import current as current_tensor_parallel

# checkpoint projection name -> part, for the per-expert layouts of the Hub
QWEN_EXPERT_NAMES = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
MIXTRAL_EXPERT_NAMES = {"w1": "gate", "w3": "up", "w2": "down"}
EXPERT_PARTS = ("gate", "up", "down")


class FusedMoE(nn.Module):
    """E SwiGLU experts: y[t] = sum_k weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = ids[t, k].

    Args:
        num_experts: E.
        hidden_size: H.
        intermediate_size: I of each expert.
        checkpoint_names: per-expert checkpoint projection names -> "gate", "up" or "down".
    """

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, checkpoint_names: dict[str, str]
    ) -> None:
        super().__init__()
        if sorted(checkpoint_names.values()) != sorted(EXPERT_PARTS):
            raise ValueError(f"checkpoint_names must map one name to each of {EXPERT_PARTS}, got {checkpoint_names}")
        self.num_experts = num_experts
        # this rank's share of each expert's intermediate rows (all of them without tensor parallelism)
        self.tp = current_tensor_parallel()
        self.intermediate_start, intermediate_size = self.tp.split(intermediate_size, "moe_intermediate_size")
        self.intermediate_size = intermediate_size
        self.checkpoint_names = dict(checkpoint_names)
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], routed weights [T, K] float32 and expert ids [T, K] int32 -> [T, H]."""
        return moe_ops.fused_experts(x, self.gate_up_proj, self.down_proj, weights, ids)

    # ---- loading (engine/models/loading.py) ----

    def param_of(self, part: str) -> str:
        """The parameter that holds `part` of every expert."""
        return "down_proj" if part == "down" else "gate_up_proj"

    def expert_weight(self, part: str, expert: int) -> torch.Tensor:
        """The view of one expert's projection: gate [I, H], up [I, H] or down [H, I]."""
        if part == "down":
            return self.down_proj.data[expert]
        start = 0 if part == "gate" else self.intermediate_size
        return self.gate_up_proj.data[expert].narrow(0, start, self.intermediate_size)

    def rank_part(self, part: str | None, param: str, tensor: torch.Tensor) -> torch.Tensor:
        """The part of a checkpoint tensor this rank holds: an expert's projection (`part`: gate/up [I, H] or
        down [H, I]) or a packed parameter whole (`part` None: gate_up_proj [E, 2I, H] or down_proj [E, H, I])."""
        if not self.tp.enabled:
            return tensor
        start, rows = self.intermediate_start, self.intermediate_size
        if part is not None:
            return tensor.narrow(1 if part == "down" else 0, start, rows)
        if param == "down_proj":
            return tensor.narrow(2, start, rows)
        full = tensor.shape[1] // 2  # gate rows, then up rows
        return torch.cat((tensor.narrow(1, start, rows), tensor.narrow(1, full + start, rows)), dim=1)

    def shards(self, param: str) -> set[tuple[int, str]]:
        """(expert, part) of every slice of a parameter, each loaded once from a per-expert checkpoint."""
        parts = ("down",) if param == "down_proj" else ("gate", "up")
        return {(e, part) for e in range(self.num_experts) for part in parts}

    def checkpoint_tensor(self, module_name: str, expert: int, part: str) -> str:
        """The per-expert checkpoint's name of a slice (what a message about a missing slice names)."""
        name = next(n for n, p in self.checkpoint_names.items() if p == part)
        return f"{module_name}.{expert}.{name}.weight"


# NOTE: the gate's E rows are far below engine/ops.py's one-token GEMV threshold, but at one token cuBLAS took
# 5.0 us for it a layer (H100, Qwen3-30B-A3B, E = 128; 13% of a decode step in the router's two kernels)
# and launches without PDL; kernels/gemv.py streams the 0.5 MB under the kernel before it
ROUTER_GEMV_MIN_FEATURES = 1


class TopKRouter(nn.Module):
    """The gate: logits = x W^T (W [E, H]), then softmax, top-k and the optional renormalization.

    Args:
        num_experts: E.
        hidden_size: H.
        top_k: K.
        renormalize: whether the K weights are divided by their sum.
    """

    def __init__(self, num_experts: int, hidden_size: int, top_k: int, renormalize: bool) -> None:
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, K] float32, ids [T, K] int32)."""
        # [T, E] in x's dtype, as transformers computes them
        logits = ops.linear(x, self.weight, gemv_min_features=ROUTER_GEMV_MIN_FEATURES)
        return moe_ops.moe_route(logits, self.top_k, self.renormalize)
