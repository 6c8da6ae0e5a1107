"""The real packaged SmolLM2-135M-Instruct: greedy chat answers equal transformers', and read well."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from engine.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "How many days are in a week?",
    "Give me one tip for better sleep.",
]
MAX_TOKENS = 24


def test_packaged_smollm2_chat_matches_transformers(smollm2_dir: Path, inferq_cache_dir: Path) -> None:
    llm = LLM("default", cache_dir=str(inferq_cache_dir), device="cpu", dtype="float32", num_kv_tokens=4096)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    ours = llm.chat(conversations, params)

    reference = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32, attn_implementation="eager")
    tokenizer = llm.tokenizer
    for conversation, (choice,) in zip(conversations, ours, strict=True):
        ids = llm.engine.apply_chat_template(conversation)
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=sorted(llm.engine.eos_token_ids),
                pad_token_id=tokenizer.pad_token_id or 0,
            )
        expected = out[0, len(ids) :].tolist()
        assert choice.token_ids == expected, (conversation[0]["content"], choice.text)
        assert choice.text == tokenizer.decode(expected, skip_special_tokens=True)
    assert "Paris" in ours[0][0].text
