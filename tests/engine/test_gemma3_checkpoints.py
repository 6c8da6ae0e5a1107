"""Gemma checkpoints beyond the tiny Gemma3ForCausalLM of the parity tests: a multimodal Gemma 3 checkpoint
served text-only (its language model, the image tower skipped), and Gemma 2, refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig
from engine.model_loader import load_model
from tests.engine.checkpoints import copy_tokenizer, randomize_weights, tiny_gemma3_config
from tests.engine.model_harness import PagedHarness

CPU = torch.device("cpu")


def build_tiny_multimodal_gemma3(out_dir: Path, tokenizer_dir: Path) -> Path:
    """A Gemma3ForConditionalGeneration checkpoint (a 1-layer SigLIP tower) written by save_pretrained."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    # final_logit_softcapping None, as in every released Gemma 3 (transformers' multimodal class ignores it)
    text_config = dict(tiny_gemma3_config().to_dict(), final_logit_softcapping=None)
    config = Gemma3Config(
        text_config=text_config, vision_config=vision, mm_tokens_per_image=4,
        image_token_index=49000, boi_token_index=48998, eoi_token_index=48999,
        architectures=["Gemma3ForConditionalGeneration"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config)
    randomize_weights(model, seed=3)
    model.save_pretrained(out_dir)
    copy_tokenizer(tokenizer_dir, out_dir)
    return out_dir


def test_multimodal_gemma3_serves_its_language_model(tmp_path: Path, smollm2_dir: Path) -> None:
    from transformers import Gemma3ForConditionalGeneration

    model_dir = build_tiny_multimodal_gemma3(tmp_path / "gemma3-mm", smollm2_dir)
    loaded = load_model(ModelConfig(model=str(model_dir)), CPU, torch.float32)
    assert loaded.hf_config.architectures == ["Gemma3ForConditionalGeneration"]
    assert loaded.max_model_len == tiny_gemma3_config().max_position_embeddings
    reference = Gemma3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation="eager").eval()  # fmt: skip
    tokens = torch.randint(100, 40000, (40,), generator=torch.Generator().manual_seed(0)).tolist()  # > window 12
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor([tokens])).logits[0].float()
    got = PagedHarness(loaded.model).step({"s": tokens})["s"]
    assert (got - expected).abs().max().item() < 1e-4


def test_gemma2_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 1000, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    }))  # fmt: skip
    with pytest.raises(ValueError, match=r"Gemma2ForCausalLM.*attn_logit_softcapping"):
        load_model(ModelConfig(model=str(tmp_path), load_format="dummy"), CPU, torch.float32)


def test_gemma3_with_attention_soft_capping_is_refused(tmp_path: Path) -> None:
    config = tiny_gemma3_config()
    config.attn_logit_softcapping = 50.0
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="attn_logit_softcapping is not supported"):
        load_model(ModelConfig(model=str(tmp_path), load_format="dummy"), CPU, torch.float32)
