"""Speculative decoding on a CUDA GPU (skipped elsewhere): the Triton engine with CUDA graphs (verification steps
replay a decode bucket's graph as decode rows, or their mixed bucket's where a prefill chunk joins them) and async
scheduling for the steps that do not verify emits the tokens of the
same engine without speculation (tiny fp32 checkpoints, greedy and seeded rows, continuous batching)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory
from tests.engine.spec_helpers import ReferenceProposer, with_proposer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ARRIVALS = [0, 0, 1, 3, 5, 8]


@pytest.fixture(scope="module")
def gpu_tiny_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return tiny_checkpoint_factory(request, tmp_path_factory)


def _engine(model_dir: Path, speculative: SpeculativeConfig) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(num_kv_tokens=4096, block_size=16),
            scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=96),
            device="cuda",
            speculative=speculative,
        )
    )


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3", "mixtral"])
def test_speculation_keeps_the_tokens_on_the_gpu(kind: str, gpu_tiny_checkpoint: Callable) -> None:
    model_dir = gpu_tiny_checkpoint(kind)
    prompts = random_prompts(len(ARRIVALS), 49152, 3, 60, seed=7)
    common = dict(max_tokens=40, ignore_eos=True)
    params = [SamplingParams(temperature=0.0, **common) if i % 2 else
              SamplingParams(temperature=0.9, top_p=0.9, seed=i, **common) for i in range(len(prompts))]  # fmt: skip
    plain = run_staggered(_engine(model_dir, SpeculativeConfig()), prompts, params, ARRIVALS)
    engine = _engine(model_dir, SpeculativeConfig(method="ngram", num_speculative_tokens=4, max_batch_size=3))
    assert engine.async_scheduling and engine.runner.graphs is not None
    with_proposer(engine, ReferenceProposer(plain))
    assert run_staggered(engine, prompts, params, ARRIVALS) == plain
    stats = engine.speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert engine.runner.graphs.num_replays > 0
    # verification steps replayed decode graphs as decode rows, or mixed graphs
    assert engine.runner.num_verified_as_rows > 0
    assert engine.runner.graphs.num_mixed_replays + engine.runner.num_verified_as_rows >= stats.num_steps


def test_draft_model_with_its_own_graphs_keeps_the_tokens_on_the_gpu(gpu_tiny_checkpoint: Callable) -> None:
    """The model as its own draft: the draft's runner replays its own decode graphs, and its proposals are kept."""
    model_dir = gpu_tiny_checkpoint("llama")
    prompts = random_prompts(4, 49152, 3, 60, seed=8)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = run_staggered(_engine(model_dir, SpeculativeConfig()), prompts, params, ARRIVALS[:4])
    config = SpeculativeConfig(method="draft", draft_model=str(model_dir), num_speculative_tokens=4)
    engine = _engine(model_dir, config)
    assert run_staggered(engine, prompts, params, ARRIVALS[:4]) == plain
    stats = engine.speculator.stats
    # fp32: the draft's decode kernels and the verification's (decode rows, or the prefill kernel where a chunk joins
    # them) agree but for rare near-ties
    assert stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens > 0
    assert engine.speculator.proposer.runner.graphs.num_replays > 0
