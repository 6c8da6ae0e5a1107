"""What a Mixture-of-Experts checkpoint's config.json says about its experts, read and checked once.

Each MoE family names the same facts differently (Mixtral's `num_local_experts` against Qwen's
`num_experts`; Mixtral always renormalizes the top-k weights, the others only with `norm_topk_prob`;
Qwen's `moe_intermediate_size` against Mixtral's and OLMoE's `intermediate_size`). A family file
says where to find each fact (`MoEFields`); `moe_spec` reads them into one `MoESpec` and rejects
what a model cannot be built from, naming the config.json field and the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MoEFields:
    """Where one family's config.json keeps each MoE fact.

    Args:
        num_experts: the field holding E, the routed experts of a sparse layer.
        intermediate_size: the field holding each routed expert's I.
        norm_topk_prob: the field saying whether the top-k weights are renormalized to sum to 1;
            None where the family always renormalizes (Mixtral).
        shared_expert_intermediate_size: the field of the shared expert's I (Qwen2-MoE); None for none.
        sparse_step: whether `decoder_sparse_step` and `mlp_only_layers` choose the sparse layers (Qwen);
            otherwise every layer is sparse.
    """

    num_experts: str
    intermediate_size: str
    norm_topk_prob: str | None
    shared_expert_intermediate_size: str | None = None
    sparse_step: bool = False


@dataclass(frozen=True)
class MoESpec:
    """The experts of a model.

    Args:
        num_experts: E.
        top_k: K, experts per token (`num_experts_per_tok`).
        intermediate_size: I of each routed expert.
        renormalize: whether the K routed weights are divided by their sum.
        shared_expert_intermediate_size: I of the always-on shared expert; 0 for none.
        sparse_layers: indices of the layers whose MLP is the MoE block (the rest are dense).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    shared_expert_intermediate_size: int
    sparse_layers: frozenset[int]

    def __post_init__(self) -> None:
        if self.num_experts < 1:
            raise ValueError(f"the number of experts must be >= 1, got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {self.num_experts}], got {self.top_k}")


def moe_spec(config: Any, fields: MoEFields, architecture: str) -> MoESpec:
    """Reads and checks the MoE facts of `config` (a transformers config).

    Raises:
        ValueError: a field missing or of the wrong type, or values that contradict each other,
            with the config.json field named.
    """
    num_layers = _int_field(config, "num_hidden_layers", architecture, minimum=1)
    num_experts = _int_field(config, fields.num_experts, architecture, minimum=1)
    top_k = _int_field(config, "num_experts_per_tok", architecture, minimum=1)
    if top_k > num_experts:
        raise ValueError(
            f"config.json: num_experts_per_tok ({top_k}) must be at most {fields.num_experts} ({num_experts}) "
            f"for {architecture}"
        )
    intermediate_size = _int_field(config, fields.intermediate_size, architecture, minimum=1)
    if fields.norm_topk_prob is None:
        renormalize = True
    else:
        renormalize = getattr(config, fields.norm_topk_prob, None)
        if not isinstance(renormalize, bool):
            raise ValueError(
                f"config.json: {fields.norm_topk_prob} must be true or false for {architecture}, got {renormalize!r}"
            )
    shared = 0
    if fields.shared_expert_intermediate_size is not None:
        shared = _int_field(config, fields.shared_expert_intermediate_size, architecture, minimum=0)
    sparse_layers = frozenset(range(num_layers))
    if fields.sparse_step:
        sparse_layers = _sparse_layers(config, num_layers, architecture)
    return MoESpec(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=intermediate_size,
        renormalize=renormalize,
        shared_expert_intermediate_size=shared,
        sparse_layers=sparse_layers,
    )


def _sparse_layers(config: Any, num_layers: int, architecture: str) -> frozenset[int]:
    """Layers i with (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers (transformers' rule)."""
    step = _int_field(config, "decoder_sparse_step", architecture, minimum=1)
    dense = getattr(config, "mlp_only_layers", None) or []
    if not isinstance(dense, list | tuple) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ValueError(
            f"config.json: mlp_only_layers must be a list of layer indices for {architecture}, got {dense!r}"
        )
    outside = sorted(i for i in dense if not 0 <= i < num_layers)
    if outside:
        raise ValueError(
            f"config.json: mlp_only_layers names layers {outside} outside [0, {num_layers}) "
            f"(num_hidden_layers = {num_layers}) for {architecture}"
        )
    return frozenset(i for i in range(num_layers) if (i + 1) % step == 0 and i not in dense)


def _int_field(config: Any, name: str, architecture: str, *, minimum: int) -> int:
    value = getattr(config, name, None)
    if value is None:
        raise ValueError(f"config.json lacks {name}, which {architecture} needs")
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"config.json: {name} must be an integer for {architecture}, got {value!r}")
    if value < minimum:
        raise ValueError(f"config.json: {name} must be >= {minimum} for {architecture}, got {value}")
    return value
