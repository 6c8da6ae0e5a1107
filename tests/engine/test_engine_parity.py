"""The whole engine (scheduler + paged KV + runner + sampler) against transformers' generate:
64 greedy tokens for 8 requests of different lengths arriving at different steps of one batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import ARCHITECTURES, load_hf_reference
from tests.engine.engine_helpers import hf_greedy, make_engine, random_prompts, run_staggered

NUM_TOKENS = 64


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_continuous_batch_matches_transformers_generate(kind: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    model_dir = tiny_checkpoint(kind)
    engine = make_engine(model_dir, max_num_batched_tokens=96)  # small budget: chunked prefills mix with decodes
    prompts = random_prompts(8, engine.vocab_size, 3, 70, seed=ARCHITECTURES.index(kind))
    arrivals = [0, 0, 1, 3, 5, 9, 17, 30]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS)
    ours = run_staggered(engine, prompts, params, arrivals)
    reference = load_hf_reference(model_dir)
    for i, prompt in enumerate(prompts):
        assert ours[f"r{i}"] == hf_greedy(reference, prompt, NUM_TOKENS), f"request {i} ({len(prompt)} tokens)"
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
