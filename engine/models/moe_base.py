"""What the Llama-shaped MoE families share: a decoder whose MLP is the sparse MoE block on the layers
the config makes sparse (every layer, or Qwen's `decoder_sparse_step` / `mlp_only_layers`) and a dense
SwiGLU MLP on the others. Each family file says where its config keeps the MoE facts (`MOE_FIELDS`),
what its per-expert checkpoint calls the projections (`EXPERT_NAMES`) and its attention.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.models.layers import GatedMLP
from engine.models.layers.fused_moe import QWEN_EXPERT_NAMES
from engine.models.layers.moe_block import SparseMoeBlock
from engine.models.llama import LlamaForCausalLM
from engine.models.loading import LLAMA_STACKED_PARAMS, load_named_weights
from engine.models.moe_spec import MoEFields, MoESpec, moe_spec


class MoEForCausalLM(LlamaForCausalLM):
    """A Llama-shaped causal LM whose sparse layers route each token to K of E experts.

    Args:
        config: the family's transformers config.
    """

    MOE_FIELDS: MoEFields
    EXPERT_NAMES: dict[str, str] = QWEN_EXPERT_NAMES

    def __init__(self, config: Any) -> None:
        # NOTE: read before the layers are built (LlamaForCausalLM's __init__ calls make_mlp)
        self.moe: MoESpec = moe_spec(config, self.MOE_FIELDS, type(self).__name__)
        super().__init__(config)

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if layer_idx in self.moe.sparse_layers:
            return SparseMoeBlock(config.hidden_size, self.moe, self.EXPERT_NAMES)
        return GatedMLP(config.hidden_size, config.intermediate_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(
            self, weights, stacked_params=LLAMA_STACKED_PARAMS, rename=self._rename,
            checkpoint_label=self.checkpoint_label,
        )  # fmt: skip

    def checkpoint_label(self, name: str) -> str:
        """A model-side tensor name as the per-expert checkpoint spells it (Mixtral renames a module)."""
        return name
