"""The whole engine on each tiny MoE checkpoint against transformers' generate, under the schedules that
reorder a batch's work: requests that share a prompt prefix (prefix cache hits), a small step budget
(chunked prefills beside decodes) and a KV pool too small for all of them (preemption and recompute).
Every request's 64 greedy tokens must be transformers' own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import MOE_ARCHITECTURES, load_hf_reference
from tests.engine.engine_helpers import hf_greedy, make_engine, random_prompts, run_staggered

NUM_TOKENS = 64
ON_GPU = torch.cuda.is_available()
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


@pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's run; test_gpu_parity.py runs the kernels in a CUDA engine")
@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_triton_kernels_give_the_torch_engines_tokens(kind: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    """The router, alignment, grouped GEMMs and one-token GEMVs (interpreted) inside the engine's padded
    steps, one-token decodes and mixed chunks alike, give the torch references' greedy tokens."""
    from engine import moe_ops, ops

    model_dir = tiny_checkpoint(kind)
    prompts = random_prompts(3, 49152, 5, 20, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = run_staggered(make_engine(model_dir, max_num_batched_tokens=32), prompts, params, [0, 1, 2])
    calls: list[tuple[bool, int]] = []
    real = moe_ops.fused_experts

    def spy(x, w13, w2, weights, ids):
        calls.append((ops.use_triton(x), x.shape[0]))
        return real(x, w13, w2, weights, ids)

    moe_ops.fused_experts = spy
    try:
        engine = make_engine(model_dir, kernels="triton", max_num_batched_tokens=32)
        engine.runner.enable_graphs(capture=False)
        assert run_staggered(engine, prompts, params, [0, 1, 2]) == plain
    finally:
        moe_ops.fused_experts = real
    assert calls and all(on_kernels for on_kernels, _ in calls)
    assert {tokens for _, tokens in calls} >= {1, 16}  # a one-token decode and a padded mixed step
