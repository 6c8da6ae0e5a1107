"""Gemma 3 text models: Gemma3ForCausalLM (1B, 270M) and the language model of Gemma3ForConditionalGeneration
checkpoints (4B, 12B, 27B), served text-only.

Legend: T = new tokens in the step, S = sequences whose logits are wanted, H = hidden size,
Hq/Hkv = query/KV heads, D = head dim, I = intermediate size, V = vocabulary.

What differs from Llama (engine/models/llama.py, whose attention it reuses):
- layers follow the config's `layer_types` (from `sliding_window_pattern`: five sliding layers, then a
  global one): sliding layers see the last `sliding_window` positions and rotate with the local RoPE base
  (`rope_local_base_freq`, 10k), global layers see everything and rotate with `rope_theta` (1M) and its
  scaling (linear x8 for 4B and up);
- softmax scale query_pre_attn_scalar ** -0.5; RMSNorm over each q and k head before the rotation;
- RMSNorm is x * (1 + w): the weights are stored as 1 + w in fp32 at load, so the shared norm kernels
  (which multiply in fp32 and round once) compute Gemma's (x * (1 + w)).to(dtype) exactly;
- four norms a layer: x += post_attn_norm(attn(input_norm(x))); x += post_ffw_norm(mlp(pre_ffw_norm(x)));
- GeGLU MLP: down(gelu_tanh(gate) * up);
- embeddings scaled by sqrt(H) (rounded to the model's dtype, as transformers does); tied LM head;
  final logits soft-capped where the config asks (cap * tanh(logits / cap)).
Attention logit soft-capping (Gemma 2) is refused: the attention kernels do not apply it.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from engine import ops
from engine.attention_metadata import AttentionMetadata
from engine.models.layers import Linear, LMHead, RMSNorm, RotaryEmbedding, VocabEmbedding, gate_up_linear
from engine.models.layers.rotary import rope_parameters
from engine.models.llama import LlamaAttention, head_dim_of, num_kv_heads_of
from engine.models.loading import LLAMA_STACKED_PARAMS, load_named_weights
from engine.parallel.group import current as current_tensor_parallel

SLIDING, GLOBAL = "sliding_attention", "full_attention"
# the norms stored as 1 + w (checkpoint name suffixes)
GEMMA_NORMS = ("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")
# prefixes of a Gemma3ForConditionalGeneration checkpoint's language model (the Hub's, then transformers 5's)
LANGUAGE_MODEL_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                           ("language_model.lm_head.", "lm_head."))  # fmt: skip
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


class GemmaRMSNorm(RMSNorm):
    """RMSNorm whose weight holds 1 + w in fp32 (see the module docstring); load through `gemma_norm_weight`."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__(hidden_size, eps)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=torch.float32), requires_grad=False)


def gemma_norm_weight(tensor: torch.Tensor) -> torch.Tensor:
    """A checkpoint's Gemma norm weight w -> the stored 1 + w (fp32)."""
    return tensor.float() + 1.0


class Gemma3Attention(LlamaAttention):
    """LlamaAttention with Gemma's scale and per-head q / k norms (applied in the RoPE + KV store kernel)."""

    def __init__(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> None:
        bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config, rotary, qkv_bias=bias, o_bias=bias, layer_idx=layer_idx,
                         scale=float(config.query_pre_attn_scalar) ** -0.5)  # fmt: skip
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)

    def qk_norm(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps


class GeGLUMLP(nn.Module):
    """down(gelu_tanh(gate(n)) * up(n)) with n = norm(x + residual). Args: hidden_size H, intermediate_size I."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size, parallel="row")

    def forward(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        gate_up, residual = norm.project(x, residual, self.gate_up_proj)  # [T, 2I], [T, H]
        return self.down_proj(ops.gelu_tanh_and_mul(gate_up)), residual  # [T, I] -> [T, H]


class Gemma3DecoderLayer(nn.Module):
    """x += post_attn_norm(attn(input_norm(x))); x += post_ffw_norm(mlp(pre_ffw_norm(x))), the residual add
    fused into the input and pre-feed-forward norms (the next layer's input norm adds this layer's output)."""

    def __init__(self, config: Any, rotary: RotaryEmbedding, layer_idx: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Gemma3Attention(config, rotary, layer_idx)
        self.mlp = GeGLUMLP(hidden, config.intermediate_size)
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's output not yet added, residual stream before it), both [T, H]."""
        attn_out, residual = self.self_attn(positions, hidden, residual, self.input_layernorm, kv_cache, meta)
        attn_out = self.post_attention_layernorm(attn_out)
        mlp_out, residual = self.mlp(attn_out, residual, self.pre_feedforward_layernorm)
        return self.post_feedforward_layernorm(mlp_out), residual


def gemma3_rotary(config: Any, layer_type: str) -> RotaryEmbedding:
    """The RoPE table of one layer type, from transformers 5's per-type `rope_parameters`."""
    per_type = getattr(config, "rope_parameters", None) or {}
    params = per_type.get(layer_type)
    if params is None:  # an older config object: rope_theta / rope_local_base_freq / rope_scaling
        if layer_type == SLIDING:
            params = {"rope_type": "default", "rope_theta": getattr(config, "rope_local_base_freq", 10000.0)}
        else:
            params = dict(getattr(config, "rope_scaling", None) or {"rope_type": "default"})
            params["rope_theta"] = getattr(config, "rope_theta", 1_000_000.0)
    theta, scaling = rope_parameters(SimpleNamespace(rope_parameters=dict(params)))
    return RotaryEmbedding(head_dim_of(config), config.max_position_embeddings, theta, scaling)


class Gemma3Model(nn.Module):
    """Scaled embedding, the decoder layers, the final norm. Args: config: a Gemma3TextConfig."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer_types = list(config.layer_types)
        rotary = {kind: gemma3_rotary(config, kind) for kind in sorted(set(self.layer_types))}
        self.rotary = nn.ModuleDict(rotary)  # one table per layer type, shared by those layers
        # a table the LM head shares stays whole (the head is replicated, decision 0061)
        tied = bool(getattr(config, "tie_word_embeddings", True))
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, vocab_parallel=not tied)
        self.embed_scale = float(config.hidden_size) ** 0.5
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(config, rotary[kind], i) for i, kind in enumerate(self.layer_types)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self._embed_scales: dict[torch.dtype, float] = {}

    def embed_scale_in(self, dtype: torch.dtype) -> float:
        """sqrt(H) rounded to `dtype`, as transformers' scaled embedding multiplies by it. A Python float (made on
        the host once a dtype), so that no step copies a scalar to the device: CUDA graphs capture the step."""
        if dtype not in self._embed_scales:
            self._embed_scales[dtype] = float(torch.tensor(self.embed_scale, dtype=dtype, device="cpu"))
        return self._embed_scales[dtype]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [T, H]
        hidden = hidden * self.embed_scale_in(hidden.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


def check_gemma3_config(config: Any) -> None:
    """What this implementation does not compute, refused by name."""
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError("attn_logit_softcapping is not supported (the attention kernels do not soft-cap scores)")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention is not supported: inferq serves causal language models")
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "gelu_pytorch_tanh")
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"hidden_activation must be 'gelu_pytorch_tanh' for Gemma 3, got {activation!r}")
    unknown = set(config.layer_types) - {SLIDING, GLOBAL}
    if unknown:
        raise ValueError(f"layer_types must be {SLIDING!r} or {GLOBAL!r}, got {sorted(unknown)}")
    if len(config.layer_types) != config.num_hidden_layers:
        raise ValueError(f"layer_types has {len(config.layer_types)} entries for {config.num_hidden_layers} layers")


class Gemma3ForCausalLM(nn.Module):
    """The model interface the ModelRunner uses (see engine/models/__init__.py).

    Args:
        config: a transformers Gemma3TextConfig (a Gemma3Config's text_config for the multimodal class).
    """

    # built for a tensor-parallel group, each rank holds its shard (engine/parallel/group.py)
    supports_tensor_parallel = True

    def __init__(self, config: Any) -> None:
        super().__init__()
        check_gemma3_config(config)
        self.config = config
        self.model = Gemma3Model(config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        tied_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tied_to)
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.num_layers = config.num_hidden_layers
        # this rank's KV heads: its slice of the KV pool
        self.num_kv_heads = current_tensor_parallel().heads(config.num_attention_heads, num_kv_heads_of(config)).kv
        self.head_dim = head_dim_of(config)

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
        """[S, H] -> [S, V] float32 (widen=False: in the model's dtype), soft-capped where the config says."""
        logits = self.lm_head(hidden, widen)
        cap = self.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self, weights, stacked_params=LLAMA_STACKED_PARAMS, rename=self._rename)

    def _rename(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        if name.startswith(VISION_PREFIXES):
            return None  # the image tower of a multimodal checkpoint: served text-only
        for prefix, ours in LANGUAGE_MODEL_PREFIXES:
            if name.startswith(prefix):
                name = ours + name[len(prefix) :]
                break
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None
        if name.endswith(GEMMA_NORMS):
            return name, gemma_norm_weight(tensor)
        return name, tensor


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """A multimodal Gemma 3 checkpoint's language model (vision tower and projector are not loaded).

    Args:
        config: the Gemma3Config; its text_config builds the model.
    """

    def __init__(self, config: Any) -> None:
        super().__init__(getattr(config, "text_config", None) or config)
