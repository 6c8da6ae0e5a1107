"""The whole engine on each tiny MoE checkpoint against transformers' generate, under the schedules that
reorder a batch's work: requests that share a prompt prefix (prefix cache hits), a small step budget
(chunked prefills beside decodes) and a KV pool too small for all of them (preemption and recompute).
Every request's 64 greedy tokens must be transformers' own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import MOE_ARCHITECTURES, load_hf_reference
from tests.engine.engine_helpers import hf_greedy, make_engine, random_prompts, run_staggered

NUM_TOKENS = 64
BLOCK_SIZE = 16


@pytest.mark.parametrize("kind", MOE_ARCHITECTURES)
def test_prefix_cache_chunks_and_preemption_keep_transformers_tokens(
    kind: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    model_dir = tiny_checkpoint(kind)
    # 16 blocks of 16: one request needs up to 8 (62 prompt + 64 output tokens), six need ~45
    engine = make_engine(model_dir, num_kv_tokens=16 * BLOCK_SIZE, block_size=BLOCK_SIZE, max_num_batched_tokens=40)
    seed = MOE_ARCHITECTURES.index(kind)
    shared = random_prompts(1, engine.vocab_size, 2 * BLOCK_SIZE, 2 * BLOCK_SIZE, seed=seed)[0]
    prompts = [shared + tail for tail in random_prompts(6, engine.vocab_size, 3, 30, seed=seed + 10)]
    arrivals = [0, 0, 2, 5, 9, 20]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS)
    ours = run_staggered(engine, prompts, params, arrivals)

    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hit_rate > 0
    assert stats.num_free_blocks == stats.num_total_blocks
    reference = load_hf_reference(model_dir)
    for i, prompt in enumerate(prompts):
        assert ours[f"r{i}"] == hf_greedy(reference, prompt, NUM_TOKENS), f"request {i} ({len(prompt)} tokens)"
