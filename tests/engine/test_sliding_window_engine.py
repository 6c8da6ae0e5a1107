"""Sliding-window models through the whole engine against transformers' generate: 64 greedy tokens for
sequences far longer than the window, in one continuous batch that shares prefixes (prefix caching), takes
prompts in budget-sized chunks (chunked prefill) and runs out of KV blocks (preemption and recompute)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import WINDOW_ARCHITECTURES, load_hf_reference, tiny_config
from tests.engine.engine_helpers import hf_greedy, make_engine, random_prompts, run_staggered

NUM_TOKENS = 64
BLOCK_SIZE = 16
ON_GPU = torch.cuda.is_available()


@pytest.mark.parametrize("kind", WINDOW_ARCHITECTURES)
def test_windowed_batch_with_prefix_cache_chunks_and_preemption(
    kind: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    model_dir = tiny_checkpoint(kind)
    window = tiny_config(kind).sliding_window
    # 13 blocks for 6 requests of up to 124 tokens (8 blocks each): preemption; a 40-token budget: chunks
    engine = make_engine(model_dir, num_kv_tokens=13 * BLOCK_SIZE, block_size=BLOCK_SIZE, max_num_batched_tokens=40)
    shared = random_prompts(1, engine.vocab_size, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE, seed=11)[0]
    suffixes = random_prompts(6, engine.vocab_size, 3, 60, seed=12)
    prompts = [shared + suffix if i % 2 == 0 else suffix for i, suffix in enumerate(suffixes)]
    assert max(len(p) for p in prompts) + NUM_TOKENS > 4 * window
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS)
    ours = run_staggered(engine, prompts, params, arrival_steps=[0, 0, 4, 6, 9, 15])
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hit_rate > 0
    assert stats.num_free_blocks == stats.num_total_blocks
    reference = load_hf_reference(model_dir)
    for i, prompt in enumerate(prompts):
        assert ours[f"r{i}"] == hf_greedy(reference, prompt, NUM_TOKENS), f"request {i} ({len(prompt)} tokens)"


@pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's run; test_gpu_parity.py runs the kernels in a CUDA engine")
@pytest.mark.parametrize("kind", ["gemma3", "mistral_window"])
def test_triton_kernels_give_the_torch_engines_tokens(kind: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    """The windowed attention kernels, GeGLU and the Gemma norms' fp32 weights in the norm, q/k-norm and
    one-token kernels (interpreted), inside the engine's padded steps, give the torch references' greedy tokens
    for prompts longer than the window."""
    model_dir = tiny_checkpoint(kind)
    prompts = random_prompts(3, 49152, 20, 40, seed=8)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = run_staggered(make_engine(model_dir, max_num_batched_tokens=32), prompts, params, [0, 1, 2])
    engine = make_engine(model_dir, kernels="triton", max_num_batched_tokens=32)
    engine.runner.enable_graphs(capture=False)
    assert run_staggered(engine, prompts, params, [0, 1, 2]) == plain
