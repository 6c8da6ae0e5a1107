"""Tiny random checkpoints of every supported architecture, written by transformers'
own `save_pretrained`, for parity and engine tests.

Each is 2 layers, hidden 64, 4 query heads over 2 KV heads (GQA; GPT-2 has no GQA),
fp32, with the REAL SmolLM2 tokenizer copied in (so vocab_size = 49152 and chat
templates, EOS ids and detokenisation behave as in production).

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

ARCHITECTURES = ("llama", "llama3_tied", "mistral", "qwen2", "qwen3", "gpt2")
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
    kind: str, out_dir: Path, tokenizer_dir: Path, *, seed: int = 0, max_shard_size: str | None = None
) -> Path:
    """Writes a tiny `kind` checkpoint (config, safetensors, generation config, tokenizer) to out_dir.

    Args:
        kind: one of ARCHITECTURES.
        out_dir: created if missing.
        tokenizer_dir: a directory holding the SmolLM2 tokenizer files (the converted
            packaged model).
        seed: weight seed.
        max_shard_size: e.g. "200KB" to write a sharded checkpoint with an index.
    """
    from transformers import AutoModelForCausalLM

    config = tiny_config(kind)
    torch.manual_seed(seed)  # transformers' own init runs first; ours overwrites every tensor
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_weights(model, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    copy_tokenizer(tokenizer_dir, out_dir)
    return out_dir


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
