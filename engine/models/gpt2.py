"""GPT-2: learned absolute positions, LayerNorm, GELU (tanh) MLP, multi-head attention.

Legend: T = new tokens (all sequences, flattened), S = sequences whose logits are
wanted, H = hidden size (n_embd), Hq = heads, D = head dim, I = MLP size (n_inner).

Checkpoints store projections as `Conv1D` weights, [in, out]; they are transposed to
the nn.Linear layout [out, in] at load time. c_attn is already a fused q|k|v.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine import ops
from engine.attention_metadata import AttentionMetadata
from engine.models.layers import LayerNorm, Linear, LMHead, PagedAttention, VocabEmbedding
from engine.models.loading import load_named_weights

_CONV1D_WEIGHTS = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")
_SUPPORTED_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")


class GPT2Attention(nn.Module):
    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        hidden = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = hidden // self.num_heads
        scale = self.head_dim**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= layer_idx + 1
        self.c_attn = Linear(hidden, 3 * hidden, bias=True)
        self.c_proj = Linear(hidden, hidden, bias=True)
        self.attn = PagedAttention(self.num_heads, self.num_heads, self.head_dim, scale)

    def forward(self, hidden: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.c_attn(hidden).chunk(3, dim=-1)  # [T, 3H] -> 3 x [T, H] (views)
        return self.c_proj(self.attn(q, k, v, kv_cache, meta))


class GPT2MLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        inner = getattr(config, "n_inner", None) or 4 * config.n_embd
        self.c_fc = Linear(config.n_embd, inner, bias=True)
        self.c_proj = Linear(inner, config.n_embd, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(ops.gelu_tanh(self.c_fc(x)))  # [T, H] -> [T, I] -> [T, H]


class GPT2Block(nn.Module):
    """x += attn(ln_1(x)); x += mlp(ln_2(x))."""

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden), kv_cache, meta)
        return hidden + self.mlp(self.ln_2(hidden))


class GPT2Model(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.wte = VocabEmbedding(config.vocab_size, config.n_embd)
        self.wpe = VocabEmbedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.wte(input_ids) + self.wpe(positions)  # [T, H]
        for block, kv_cache in zip(self.h, kv_caches, strict=True):
            hidden = block(hidden, kv_cache, meta)
        return self.ln_f(hidden)


class GPT2LMHeadModel(nn.Module):
    """The model interface the ModelRunner uses (see engine/models/__init__.py).

    Args:
        config: a transformers GPT2Config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        activation = getattr(config, "activation_function", "gelu_new")
        if activation not in _SUPPORTED_ACTIVATIONS:
            raise ValueError(f"activation_function must be one of {_SUPPORTED_ACTIVATIONS}, got {activation!r}")
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        self.transformer = GPT2Model(config)
        tied_to = self.transformer.wte if self.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.n_embd, tied_to)
        self.num_layers = config.n_layer
        self.num_kv_heads = config.n_head
        self.head_dim = config.n_embd // config.n_head

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> final-normed hidden states [T, H]."""
        return self.transformer(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """[S, H] -> [S, V] float32 (widen=False: in the model's dtype, see LMHead)."""
        return self.lm_head(hidden, widen)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self, weights, rename=self._rename)

    def _rename(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            return None  # causal-mask buffers of old checkpoints
        if name == "lm_head.weight":
            return None if self.tie_word_embeddings else (name, tensor)
        if not name.startswith("transformer."):
            name = "transformer." + name  # the original `gpt2` checkpoints have no prefix
        if name.endswith(_CONV1D_WEIGHTS):
            tensor = tensor.t()  # Conv1D [in, out] -> Linear [out, in]
        return name, tensor
