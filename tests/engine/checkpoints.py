"""Tiny random checkpoints of every supported architecture, written by transformers'
own `save_pretrained`, for parity and engine tests.

Each is 2 layers, hidden 64, 4 query heads over 2 KV heads (GQA; GPT-2 has no GQA),
fp32, with the REAL SmolLM2 tokenizer copied in (so vocab_size = 49152 and chat
templates, EOS ids and detokenisation behave as in production).

The MoE variants keep these sizes with small experts (I = 32 to 48) and odd expert counts; together
they cover top-k 2 to 8, renormalized or not, a shared expert (Qwen2-MoE), a dense layer among sparse
ones (Qwen3-MoE's mlp_only_layers), OLMoE's whole-projection q/k norms with clip_qkv.

Weights are drawn much larger than transformers' init (projections N(0, 0.2),
embeddings N(0, 1), norms 1 + N(0, 0.1), biases N(0, 0.1)) so logits are spread out:
the gap between the top two logits is rarely below 1e-2, and greedy comparisons test
the model rather than float rounding.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

MOE_ARCHITECTURES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")
# Sliding windows shorter than the tests' sequences (so the window changes the outputs), not a multiple of the
# tests' 16-token blocks: Mistral's on every layer, Qwen2's from max_window_layers on, Gemma 3's on two
# layers of three beside a global one.
WINDOW_ARCHITECTURES = ("mistral_window", "qwen2_window", "gemma3")
ARCHITECTURES = ("llama", "llama3_tied", "mistral", "qwen2", "qwen3", "gpt2", *MOE_ARCHITECTURES,
                 *WINDOW_ARCHITECTURES)  # fmt: skip
# How the experts' weights are stored: "hub" as transformers' save_pretrained writes them (per expert:
# experts.{e}.gate_proj.weight, Mixtral's block_sparse_moe.experts.{e}.w1.weight), "packed" as the
# model holds them in transformers 5 (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]).
EXPERT_LAYOUTS = ("hub", "packed")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
SMOLLM2_VOCAB_SIZE = 49152
SMOLLM2_BOS, SMOLLM2_EOS = 1, 2

_LLAMA_LIKE = dict(
    vocab_size=SMOLLM2_VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=SMOLLM2_BOS,
    eos_token_id=SMOLLM2_EOS,
)


def tiny_config(kind: str) -> Any:
    """The transformers config of one tiny architecture variant."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if kind in MOE_ARCHITECTURES:
        return tiny_moe_config(kind)

    if kind == "llama":  # untied, default rope
        return LlamaConfig(**_LLAMA_LIKE, tie_word_embeddings=False)
    if kind == "llama3_tied":  # tied embeddings, Llama 3.1 rope scaling, attention and MLP biases
        rope_scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,  # short, so all three frequency bands occur
        }
        return LlamaConfig(
            **_LLAMA_LIKE, tie_word_embeddings=True, rope_scaling=rope_scaling, attention_bias=True, mlp_bias=True
        )
    if kind == "mistral":  # head_dim from config, not H / Hq
        return MistralConfig(**_LLAMA_LIKE, head_dim=32, sliding_window=None, tie_word_embeddings=False)
    if kind == "qwen2":  # q/k/v biases, tied like Qwen2.5-0.5B
        return Qwen2Config(**_LLAMA_LIKE, tie_word_embeddings=True, use_sliding_window=False)
    if kind == "qwen3":  # per-head q/k norm, head_dim from config
        return Qwen3Config(**_LLAMA_LIKE, head_dim=32, tie_word_embeddings=False)
    if kind == "mistral_window":
        return MistralConfig(**_LLAMA_LIKE, head_dim=32, sliding_window=24, tie_word_embeddings=False)
    if kind == "qwen2_window":  # layer 0 full, layer 1 sliding
        return Qwen2Config(**_LLAMA_LIKE, tie_word_embeddings=True, use_sliding_window=True, sliding_window=20,
                           max_window_layers=1)  # fmt: skip
    if kind == "gemma3":
        return tiny_gemma3_config()
    if kind == "gpt2":
        return GPT2Config(
            vocab_size=SMOLLM2_VOCAB_SIZE,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            bos_token_id=SMOLLM2_BOS,
            eos_token_id=SMOLLM2_EOS,
        )
    raise ValueError(f"unknown tiny architecture {kind!r}; known: {ARCHITECTURES}")


def tiny_gemma3_config() -> Any:
    """Gemma 3 text: layers sliding, sliding, global (sliding_window_pattern 3), a window of 12, local and
    global RoPE bases with the global one linearly scaled (as Gemma-3-4B's), a softmax scale from
    query_pre_attn_scalar unlike D ** -0.5, final logits soft-capped."""
    from transformers import Gemma3TextConfig

    fields = {k: v for k, v in _LLAMA_LIKE.items() if k not in ("rope_theta",)}
    return Gemma3TextConfig(
        **dict(fields, num_hidden_layers=3), head_dim=32, query_pre_attn_scalar=24, sliding_window=12,
        sliding_window_pattern=3, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        }, final_logit_softcapping=50.0, tie_word_embeddings=True, architectures=["Gemma3ForCausalLM"],
    )  # fmt: skip


def tiny_moe_config(kind: str) -> Any:
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig

    untied = dict(_LLAMA_LIKE, tie_word_embeddings=False)
    if kind == "qwen2_moe":  # 7 experts top-4 not renormalized, a shared expert, q/k/v biases
        return Qwen2MoeConfig(
            **untied, num_experts=7, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=False,
            shared_expert_intermediate_size=96, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
        )  # fmt: skip
    if kind == "qwen3_moe":  # 11 experts top-8 renormalized; layer 1 of 3 dense (mlp_only_layers)
        return Qwen3MoeConfig(
            **dict(untied, num_hidden_layers=3), head_dim=32, num_experts=11, num_experts_per_tok=8,
            moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
        )  # fmt: skip
    if kind == "mixtral":  # 8 experts top-2, always renormalized; head_dim from config
        return MixtralConfig(**dict(untied, intermediate_size=48), num_local_experts=8, num_experts_per_tok=2,
                             head_dim=32, sliding_window=None)  # fmt: skip
    if kind == "olmoe":  # 9 experts top-3 not renormalized; q/k norms over whole projections; clip_qkv
        return OlmoeConfig(**dict(untied, intermediate_size=32), num_experts=9, num_experts_per_tok=3,
                           norm_topk_prob=False, clip_qkv=2.0)  # fmt: skip
    raise ValueError(f"unknown tiny MoE architecture {kind!r}; known: {MOE_ARCHITECTURES}")


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    """Large-scale random weights (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if param.dim() == 1:
            is_norm_weight = name.endswith("weight")
            param.copy_(1.0 + 0.1 * noise if is_norm_weight else 0.1 * noise)
        elif "embed" in name or ".wte." in name or ".wpe." in name:
            param.copy_(noise)
        else:
            param.copy_(0.2 * noise)


def build_tiny_checkpoint(
    kind: str,
    out_dir: Path,
    tokenizer_dir: Path,
    *,
    seed: int = 0,
    max_shard_size: str | None = None,
    expert_layout: str = "hub",
) -> Path:
    """Writes a tiny `kind` checkpoint (config, safetensors, generation config, tokenizer) to out_dir.

    Args:
        kind: one of ARCHITECTURES.
        out_dir: created if missing.
        tokenizer_dir: a directory holding the SmolLM2 tokenizer files (the converted
            packaged model).
        seed: weight seed.
        max_shard_size: e.g. "200KB" to write a sharded checkpoint with an index.
        expert_layout: one of EXPERT_LAYOUTS (MoE kinds): "hub" is save_pretrained's own output;
            "packed" is the model's state dict as transformers 5 holds it, written with safetensors.
    """
    from transformers import AutoModelForCausalLM

    if expert_layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert_layout must be one of {EXPERT_LAYOUTS}, got {expert_layout!r}")
    config = tiny_config(kind)
    torch.manual_seed(seed)  # transformers' own init runs first; ours overwrites every tensor
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_weights(model, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    if expert_layout == "packed":
        write_packed_experts(model, out_dir)
    copy_tokenizer(tokenizer_dir, out_dir)
    return out_dir


def write_packed_experts(model: torch.nn.Module, out_dir: Path) -> None:
    """Replaces the checkpoint's weights by the model's state dict, one file: packed experts under the
    names transformers 5's modules give them (model.layers.{i}.mlp.experts.gate_up_proj, ...)."""
    from safetensors.torch import save_file

    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if not any(name.endswith(".experts.gate_up_proj") for name in state):
        raise ValueError(f"{type(model).__name__} holds no packed experts")
    for path in [*out_dir.glob("*.safetensors"), *out_dir.glob("*.safetensors.index.json")]:
        path.unlink()
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def copy_tokenizer(tokenizer_dir: Path, out_dir: Path) -> None:
    copied = 0
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
            copied += 1
    if not (out_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir} (copied {copied} tokenizer files)")


def load_hf_reference(model_dir: Path) -> torch.nn.Module:
    """transformers' model on the same checkpoint: fp32, eager attention, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()
