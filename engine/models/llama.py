"""Llama family: Llama 2/3/3.1/3.2, TinyLlama, SmolLM2 and Mistral (with its sliding window).

Legend: T = new tokens in the step (all sequences, flattened), S = sequences whose
logits are wanted, H = hidden size, Hq/Hkv = query/KV heads, D = head dim,
I = intermediate size, V = vocabulary, L = layers.

Pre-norm decoder: x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)); logits = head(rmsnorm(x)).
The residual stream is carried beside the hidden state so each RMSNorm fuses the add
before it. Qwen2 and Qwen3 reuse these classes (qwen2.py, qwen3.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine import ops
from engine.attention_metadata import AttentionMetadata
from engine.models.layers import (
    GatedMLP,
    Linear,
    LMHead,
    PagedAttention,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
    qkv_linear,
)
from engine.models.layers.rotary import rope_parameters
from engine.models.loading import LLAMA_STACKED_PARAMS, load_named_weights
from engine.parallel.group import current as current_tensor_parallel


def head_dim_of(config: Any) -> int:
    """D: the config's head_dim when given (Qwen3, Mistral Nemo), else H / Hq."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def num_kv_heads_of(config: Any) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def sliding_window_of(config: Any, layer_idx: int) -> int | None:
    """Layer layer_idx's sliding window: the config's `sliding_window` where `layer_types` marks the layer
    "sliding_attention" (Qwen2 with use_sliding_window from max_window_layers on, Gemma 3), on every layer
    where the config has no layer_types (Mistral); None (full attention) elsewhere."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    return int(window)


class LlamaAttention(nn.Module):
    """Fused QKV projection, rotary embedding, paged attention, output projection.

    Args:
        config: the transformers config.
        rotary: the model's one RotaryEmbedding (shared by every layer: one cos/sin table).
        qkv_bias: whether q/k/v projections have biases.
        o_bias: whether the output projection has a bias.
        layer_idx: the layer's index (its sliding window: sliding_window_of).
        scale: the softmax scale; None: D ** -0.5.
    """

    def __init__(
        self, config: Any, rotary: RotaryEmbedding, *, qkv_bias: bool, o_bias: bool, layer_idx: int,
        scale: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        num_heads, num_kv_heads = config.num_attention_heads, num_kv_heads_of(config)
        heads = current_tensor_parallel().heads(num_heads, num_kv_heads)  # this rank's (all without TP)
        self.num_heads = heads.q
        self.num_kv_heads = heads.kv
        self.head_dim = head_dim_of(config)
        self.qkv_proj = qkv_linear(config.hidden_size, num_heads, num_kv_heads, self.head_dim, qkv_bias)
        self.o_proj = Linear(num_heads * self.head_dim, config.hidden_size, o_bias, parallel="row")
        self.rotary_emb = rotary
        scale = self.head_dim**-0.5 if scale is None else scale
        window = sliding_window_of(config, layer_idx)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, scale, window)

    def qk_norm(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """Hook: a per-head RMSNorm of q and k before the rotation, as (q_weight, k_weight, eps),
        applied in the RoPE + KV store kernel (Qwen3); None for Llama."""
        return None

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm: RMSNorm,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pre-normed attention block: (o_proj(attn(qkv_proj(norm(hidden + residual)))), hidden + residual).

        The norm and the qkv projection are one op (RMSNorm.project): one kernel at one token.
        """
        num_tokens = hidden.shape[0]
        qk_norm = self.qk_norm()
        if qk_norm is None and self.qkv_proj.quant is None and ops.fuses_qkv_rope(hidden, self.qkv_proj.weight):
            # one token: norm, qkv, RoPE and the KV store as one kernel (engine.ops.QKV_ROPE_FUSION)
            qkv, residual = ops.rms_norm_qkv_rope(
                hidden, residual, norm.weight, norm.eps, self.qkv_proj.weight, self.qkv_proj.bias, positions,
                self.rotary_emb.cos_sin_cache, kv_cache, meta.slot_mapping, self.num_heads,
            )  # fmt: skip
            q, _, _ = self.qkv_proj.split(qkv)
            return self.o_proj(self.attn.attend(q, kv_cache, meta)), residual
        qkv, residual = norm.project(hidden, residual, self.qkv_proj)  # [T, (Hq + 2 Hkv) * D], [T, H]
        q, k, v = self.qkv_proj.split(qkv)  # [T, Hq*D], [T, Hkv*D], [T, Hkv*D]
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        rotary = (positions, self.rotary_emb.cos_sin_cache)  # applied inside attn, fused with the KV store
        out = self.o_proj(self.attn(q, k, v, kv_cache, meta, rotary, qk_norm))  # [T, Hq*D] -> [T, H]
        return out, residual


class LlamaDecoderLayer(nn.Module):
    """x += attn(norm(x)); x += mlp(norm(x)), with the residual add fused into each norm and each
    norm into the projection after it (one kernel at one token: engine.ops.rms_norm_linear)."""

    def __init__(self, config: Any, attention: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp  # GatedMLP, or an MoE block: called as mlp(hidden, residual, norm)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's output not yet added, residual stream before it), both [T, H]."""
        hidden, residual = self.self_attn(positions, hidden, residual, self.input_layernorm, kv_cache, meta)
        return self.mlp(hidden, residual, self.post_attention_layernorm)


class LlamaModel(nn.Module):
    """Embedding, L decoder layers, final norm.

    Args:
        config: the transformers config.
        make_attention: builds layer i's attention from (config, shared rotary embedding, i).
        make_mlp: builds layer i's MLP from (config, i).
    """

    def __init__(self, config: Any, make_attention: Any, make_mlp: Any) -> None:
        super().__init__()
        theta, scaling = rope_parameters(config)
        rotary = RotaryEmbedding(head_dim_of(config), config.max_position_embeddings, theta, scaling)
        # a table the LM head shares stays whole (the head is replicated, decision 0061)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, vocab_parallel=not tied)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, make_attention(config, rotary, i), make_mlp(config, i))
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [T, H]
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """The model interface the ModelRunner uses (see engine/models/__init__.py).

    Args:
        config: a transformers LlamaConfig (or MistralConfig, Qwen2Config, Qwen3Config).
    """

    # built for a tensor-parallel group, each rank holds its shard (engine/parallel/group.py)
    supports_tensor_parallel = True

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden_act = getattr(config, "hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' for {type(self).__name__}, got {hidden_act!r}")
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = LlamaModel(config, self.make_attention, self.make_mlp)
        tied_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tied_to)
        self.num_layers = config.num_hidden_layers
        # this rank's KV heads: its slice of the KV pool
        self.num_kv_heads = current_tensor_parallel().heads(config.num_attention_heads, num_kv_heads_of(config)).kv
        self.head_dim = head_dim_of(config)

    def make_attention(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return LlamaAttention(config, rotary, qkv_bias=bias, o_bias=bias, layer_idx=layer_idx)

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        """Layer layer_idx's MLP (MoE families override it)."""
        return GatedMLP(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> final-normed hidden states [T, H]."""
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """[S, H] -> [S, V] float32 (widen=False: in the model's dtype, see LMHead)."""
        return self.lm_head(hidden, widen)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self, weights, stacked_params=LLAMA_STACKED_PARAMS, rename=self._rename)

    def _rename(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        if "rotary_emb.inv_freq" in name:
            return None  # older checkpoints saved the frequencies; we compute them
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None  # some tied checkpoints still carry a copy of the embedding
        return name, tensor


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral is Llama with GQA and, where the config has one, a sliding window on every layer (4096 for
    Mistral-7B-v0.1; v0.2+ checkpoints have none): attention skips the KV blocks before it."""
