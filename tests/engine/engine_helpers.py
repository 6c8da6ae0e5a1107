"""Small helpers for engine-level tests: build an engine on CPU, run requests that
arrive at chosen steps, and the transformers greedy reference."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def make_engine(
    model_dir: Path | str,
    *,
    num_kv_tokens: int = 8192,
    block_size: int = 16,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 2048,
    enable_prefix_caching: bool = True,
    max_model_len: int | None = None,
    cache_dir: Path | None = None,
    kernels: str = "torch",
    async_scheduling: bool = False,
    speculative: SpeculativeConfig | None = None,
    tensor_parallel_size: int = 1,
) -> LLMEngine:
    config = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", max_model_len=max_model_len),
        cache=CacheConfig(
            block_size=block_size, num_kv_tokens=num_kv_tokens, enable_prefix_caching=enable_prefix_caching
        ),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
        device="cpu",
        kernels=kernels,
        async_scheduling=async_scheduling,
        speculative=speculative or SpeculativeConfig(),
        parallel=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
    )
    return LLMEngine(config, cache_dir=str(cache_dir) if cache_dir else None)


def mixed_sampling_params(max_tokens: int) -> list[SamplingParams]:
    """Seeded rows with temperature and each filter (top-p; top-k with min-p; all three) and a greedy row."""
    common = dict(max_tokens=max_tokens, ignore_eos=True)
    return [
        SamplingParams(temperature=0.8, top_p=0.9, seed=1, **common),
        SamplingParams(temperature=1.1, top_k=50, min_p=0.05, seed=2, **common),
        SamplingParams(temperature=0.0, **common),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=3, **common),
    ]


def random_prompts(count: int, vocab_size: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Stay clear of the special tokens at the start of the SmolLM2 vocabulary.
    return [[rng.randrange(100, vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


def run_staggered(
    engine: LLMEngine,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    arrival_steps: list[int] | None = None,
) -> dict[str, list[int]]:
    """Adds request i at step arrival_steps[i] (all at 0 by default); returns tokens per request id."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    arrival_steps = arrival_steps or [0] * len(prompts)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    pending = sorted(range(len(prompts)), key=lambda i: arrival_steps[i])
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and arrival_steps[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts[i], params[i])
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                assert out.finish_reason in ("stop", "length"), out
        step += 1
    return tokens


def hf_greedy(model: torch.nn.Module, prompt: list[int], num_tokens: int) -> list[int]:
    """transformers' generate, greedy, exactly num_tokens new tokens (EOS suppressed like min_tokens)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
