"""Mixtral (8x7B, 8x22B): Mistral attention and, on every layer, `num_local_experts` experts of
`intermediate_size`, top-k with the K weights always renormalized.

The Hub's checkpoints keep the block under `block_sparse_moe` with experts `w1` (gate), `w3` (up) and
`w2` (down); transformers 5 renames the block `mlp` and packs the experts. Both load here: the module is
`mlp`, as in every other family.
A sliding window (none in 8x7B-v0.1's and 8x22B's configs) is applied as for Mistral.
"""

from __future__ import annotations

import torch

from engine.models.layers.fused_moe import MIXTRAL_EXPERT_NAMES
from engine.models.moe_base import MoEForCausalLM
from engine.models.moe_spec import MoEFields

HUB_BLOCK, BLOCK = ".block_sparse_moe.", ".mlp."


class MixtralForCausalLM(MoEForCausalLM):
    """Args: config: a transformers MixtralConfig."""

    MOE_FIELDS = MoEFields(num_experts="num_local_experts", intermediate_size="intermediate_size", norm_topk_prob=None)
    EXPERT_NAMES = MIXTRAL_EXPERT_NAMES

    def _rename(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        return super()._rename(name.replace(HUB_BLOCK, BLOCK), tensor)

    def checkpoint_label(self, name: str) -> str:
        return name.replace(BLOCK, HUB_BLOCK)
