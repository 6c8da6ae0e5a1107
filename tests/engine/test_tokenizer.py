"""The checkpoint's tokenizer, EOS ids and chat template (SmolLM2's real tokenizer)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.tokenizer import apply_chat_template, eos_token_ids, load_generation_config, load_tokenizer
from engine.weights.errors import CheckpointError

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_template_renders_smollm2_turns(tiny_llama_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_llama_dir)
    ids = apply_chat_template(tokenizer, MESSAGES)
    assert all(isinstance(i, int) for i in ids)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # special tokens, not text


def test_missing_chat_template_is_a_clear_error(tiny_llama_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_llama_dir)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(tokenizer, MESSAGES)


def test_eos_ids_of_smollm2(smollm2_dir: Path) -> None:
    from transformers import AutoConfig

    tokenizer = load_tokenizer(smollm2_dir)
    ids = eos_token_ids(AutoConfig.from_pretrained(smollm2_dir), load_generation_config(smollm2_dir), tokenizer)
    assert ids == {2} and tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"


def test_eos_ids_are_the_union_of_all_sources() -> None:
    # Llama 3 Instruct: config.json says <|end_of_text|>, generation_config adds <|eot_id|>.
    config = SimpleNamespace(eos_token_id=128001)
    generation_config = SimpleNamespace(eos_token_id=[128001, 128008, 128009])
    tokenizer = SimpleNamespace(eos_token_id=128009)
    assert eos_token_ids(config, generation_config, tokenizer) == {128001, 128008, 128009}
    assert eos_token_ids(SimpleNamespace(eos_token_id=None), None, SimpleNamespace(eos_token_id=5)) == {5}


def test_generation_config_absent_is_none(tmp_path: Path) -> None:
    assert load_generation_config(tmp_path) is None


def test_directory_without_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        load_tokenizer(tmp_path)
