"""Our models against Hugging Face transformers on the same checkpoints, fp32 on CPU.

Each architecture runs three steps over one paged KV pool: a flat varlen prefill of
three prompts of different lengths, a decode step (one token per sequence, attending
to the cached prompt), and a mixed step (a 3-token chunk beside a decode). Every
logit row must be within 1e-4 of transformers' full-sequence forward.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig
from engine.model_loader import load_model
from engine.tokenizer import apply_chat_template, eos_token_ids, load_generation_config, load_tokenizer
from tests.engine.checkpoints import ARCHITECTURES, SMOLLM2_VOCAB_SIZE, build_tiny_checkpoint, load_hf_reference
from tests.engine.model_harness import PagedHarness, greedy_generate

CPU = torch.device("cpu")
ATOL = 1e-4
PROMPT_LENGTHS = (5, 17, 33)  # within one block, just over one, over two


def load_ours(model_dir: Path) -> torch.nn.Module:
    return load_model(ModelConfig(model=str(model_dir)), CPU, torch.float32).model


def random_prompts(seed: int) -> dict[str, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return {
        f"seq{i}": torch.randint(3, SMOLLM2_VOCAB_SIZE, (n,), generator=generator).tolist()
        for i, n in enumerate(PROMPT_LENGTHS)
    }


@torch.no_grad()
def reference_logits(reference: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    return reference(torch.tensor([token_ids])).logits[0].float()  # [L, V]


def assert_logits_close(ours: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert ours.shape == expected.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(expected.shape)}"
    error = (ours - expected).abs().max().item()
    assert error < ATOL, f"{what}: max abs logit error {error:.3g} >= {ATOL}"


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_logits_match_transformers(kind: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    model_dir = tiny_checkpoint(kind)
    harness = PagedHarness(load_ours(model_dir))
    reference = load_hf_reference(model_dir)
    sequences = random_prompts(seed=len(kind))

    # Step 1: every prompt in one flat varlen prefill.
    got = harness.step(sequences)
    gaps = []
    for seq_id, tokens in sequences.items():
        expected = reference_logits(reference, tokens)
        assert_logits_close(got[seq_id], expected, f"{kind} prefill {seq_id}")
        top2 = expected.topk(2, dim=-1).values
        gaps.append(top2[:, 0] - top2[:, 1])
    # The checkpoints are meant to separate the top logits well beyond the tolerance.
    assert (torch.cat(gaps) > 1e-2).float().mean() >= 0.9

    # Step 2: decode one greedy token per sequence, reading the prompt from the cache.
    new_tokens = {seq_id: [int(logits[-1].argmax())] for seq_id, logits in got.items()}
    got = harness.step(new_tokens)
    for seq_id, tokens in new_tokens.items():
        sequences[seq_id] += tokens
        expected = reference_logits(reference, sequences[seq_id])[-1:]
        assert_logits_close(got[seq_id], expected, f"{kind} decode {seq_id}")

    # Step 3: mixed: a 3-token chunk over a cached prefix beside a decode; seq2 sits out.
    new_tokens = {"seq0": [11, 12, 13], "seq1": [int(got["seq1"][-1].argmax())]}
    got = harness.step(new_tokens)
    for seq_id, tokens in new_tokens.items():
        sequences[seq_id] += tokens
        expected = reference_logits(reference, sequences[seq_id])[-len(tokens) :]
        assert_logits_close(got[seq_id], expected, f"{kind} mixed {seq_id}")


def test_sharded_checkpoint_loads_identically(
    tiny_checkpoint: Callable[[str], Path], smollm2_dir: Path, tmp_path: Path
) -> None:
    single_dir = tiny_checkpoint("llama")
    sharded_dir = build_tiny_checkpoint("llama", tmp_path / "sharded", smollm2_dir, max_shard_size="200KB")
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    assert len(list(sharded_dir.glob("*.safetensors"))) > 2

    single, sharded = load_ours(single_dir), load_ours(sharded_dir)
    single_params, sharded_params = dict(single.named_parameters()), dict(sharded.named_parameters())
    assert single_params.keys() == sharded_params.keys()
    for name, param in single_params.items():
        assert torch.equal(param, sharded_params[name]), name
    prompt = {"s": random_prompts(seed=1)["seq1"]}
    assert torch.equal(PagedHarness(single).step(prompt)["s"], PagedHarness(sharded).step(prompt)["s"])


def test_packaged_smollm2_answers_paris(smollm2_dir: Path, inferq_cache_dir: Path) -> None:
    loaded = load_model(ModelConfig(model="default"), CPU, torch.float32, cache_dir=str(inferq_cache_dir))
    assert loaded.model_dir == smollm2_dir  # converted once per cache, then found again
    assert loaded.max_model_len == 8192
    tokenizer = load_tokenizer(loaded.model_dir)
    eos = eos_token_ids(loaded.hf_config, load_generation_config(loaded.model_dir), tokenizer)
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    output = greedy_generate(
        loaded.model, prompt, max_new_tokens=10, stop_ids=eos, until=lambda ids: "Paris" in tokenizer.decode(ids)
    )
    assert "Paris" in tokenizer.decode(output), tokenizer.decode(output)
