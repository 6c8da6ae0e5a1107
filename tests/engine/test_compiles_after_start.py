"""A started engine compiles no Triton kernel while it serves (GPU).

Triton compiles a kernel variant the first time a launch needs it: a new constexpr, dtype, or class of
an integer argument (1, a multiple of 16, anything else) that the kernel specializes. A compile takes
~0.1-1 s, on a fresh worker with an empty cache; in the middle of serving it stalls every request in
the step (H100, 2026-11-26: the staging kernel's step-varying sizes cost the first offline run 14%). So
every variant that serving needs must be compiled while the engine starts: the warm-up forwards and
the CUDA-graph capture (engine/model_runner.py). The workload here crosses what varies from step to
step: prompts of 1, 16 and other token counts, a prompt chunked over steps, arrivals that make mixed
steps, every decode bucket up to max_num_seqs, logprobs and each sampling filter.

NOTE: variants live in the process (each kernel's cache), so every test first empties inferq's kernels'
caches (forget_built_kernels): the variants its engine needs are then looked up again, from Triton's disk
cache, and counted where they are needed. Triton's jit_cache_hook runs when a launch finds no variant in the
kernel's in-process cache, before it compiles or loads one from the disk cache, so a warm disk cache does not
hide a variant here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import kernels
from bench.kernel_variants import VariantLog
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import mixed_sampling_params, random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory

ON_GPU = torch.cuda.is_available()
MAX_NUM_SEQS = 16
SMALL = dict(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=256)  # steps within the captured buckets
# A budget over the largest mixed graph (8,192 tokens, engine/cuda_graphs.py): the steps over it run eagerly.
OVER_GRAPHS = dict(max_num_seqs=256, max_num_batched_tokens=16384)


@pytest.fixture(scope="module")
def tiny_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    return tiny_checkpoint_factory(request, tmp_path_factory)


def forget_built_kernels() -> None:
    """Empties the in-process variant cache of every inferq kernel (not the disk cache)."""
    from triton.runtime.jit import JITFunction

    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name == "interpreter":
            continue
        for obj in vars(importlib.import_module(f"kernels.{info.name}")).values():
            if isinstance(obj, JITFunction):
                obj.device_caches.clear()


def serve_varied_steps(engine: LLMEngine) -> None:
    """Requests whose steps take every per-step size class the engine meets in serving."""
    vocab = engine.vocab_size
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    # prefills of 1, 16, 37 tokens alone, then one chunked over two steps (300 > 256 a step)
    for length in (1, 16, 37, 300):
        run_staggered(engine, [random_prompts(1, vocab, length, length, seed=length)[0]], greedy)
    # arrivals while others decode (mixed steps), every decode bucket up to MAX_NUM_SEQS rows, each sampler
    prompts = random_prompts(MAX_NUM_SEQS, vocab, 2, 90, seed=7)
    sampling = mixed_sampling_params(max_tokens=12)
    params = [sampling[i % len(sampling)] for i in range(MAX_NUM_SEQS)]
    run_staggered(engine, prompts, params, arrival_steps=list(range(MAX_NUM_SEQS)))
    run_staggered(engine, prompts, params)  # all at once: a 16-row decode batch
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3)
    run_staggered(engine, prompts[:3], with_logprobs)


def serve_eager_steps(engine: LLMEngine) -> None:
    """Steps over the largest mixed graph (8,192 tokens), which run eagerly: prefills whose token counts are
    and are not multiples of 16, of an even and an odd number of prompts, and prompts arriving while others
    decode (the tiny checkpoints hold 1,024 positions, so each step has at least nine prompts)."""
    vocab = engine.vocab_size
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for lengths in ((1000,) * 9, (992,) * 9, (600, 901, 777, 1000, 850, 1000, 999, 1000, 1000, 1000, 1000)):
        prompts = [random_prompts(1, vocab, n, n, seed=i * 1024 + n)[0] for i, n in enumerate(lengths)]
        run_staggered(engine, prompts, greedy)
    prompts = random_prompts(40, vocab, 500, 1000, seed=9)
    run_staggered(engine, prompts, greedy, arrival_steps=[i // 12 for i in range(40)])


def _engine(kind_dir: Path, scheduler: dict, enforce_eager: bool = False) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(kind_dir), dtype="bfloat16"),
            scheduler=SchedulerConfig(**scheduler),
            cache=CacheConfig(num_kv_tokens=65536),
            device="cuda",
            enforce_eager=enforce_eager,
        )
    )


needs_gpu = pytest.mark.skipif(not ON_GPU, reason="Triton compiles for a CUDA GPU (the interpreter compiles nothing)")


@needs_gpu
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_started_engine_compiles_no_kernel_while_serving(kind: str, tiny_ckpt: Callable[[str], Path]) -> None:
    forget_built_kernels()
    with VariantLog() as log:
        engine = _engine(tiny_ckpt(kind), SMALL)
        at_start = len(log.variants)
        serve_varied_steps(engine)
    assert_none_after_start(log, at_start)


@needs_gpu
def test_eager_steps_over_the_largest_graph_compile_no_kernel(tiny_ckpt: Callable[[str], Path]) -> None:
    """A step budget over the largest mixed graph: steps over 8,192 tokens run eagerly, at any token and sequence
    count. Their kernels take the same variants as the captured buckets' (a token count of 1, a multiple of 16 or
    other): this passed with no warm-up added for it when the largest graph held 512 tokens (H100,
    2026-11-26, two calls recorded in 2b585a6); kept as the guard of that coverage."""
    forget_built_kernels()
    with VariantLog() as log:
        engine = _engine(tiny_ckpt("llama"), OVER_GRAPHS)
        at_start = len(log.variants)
        serve_eager_steps(engine)
    assert_none_after_start(log, at_start)


@needs_gpu
def test_an_eager_engine_compiles_no_kernel_while_serving(tiny_ckpt: Callable[[str], Path]) -> None:
    """enforce_eager: no graph capture; decode and small mixed steps padded to the graphs' buckets, each
    bucket run once at start. Unpadded (H100, 2026-11-26, a fresh cache) this engine built 47 variants, 17 s
    of compiles, while serving: decode attention and its merge take the split count, which follows the
    batch size, as a constexpr, and RMSNorm its row count's class."""
    forget_built_kernels()
    with VariantLog() as log:
        engine = _engine(tiny_ckpt("llama"), SMALL, enforce_eager=True)
        at_start = len(log.variants)
        serve_varied_steps(engine)
    assert_none_after_start(log, at_start)


def assert_none_after_start(log: VariantLog, at_start: int) -> None:
    assert at_start > 0  # the log sees Triton's compiles at all
    after_start = [f"{v} ({s:.2f} s)" for v, s in zip(log.variants[at_start:], log.seconds[at_start:], strict=False)]
    assert not after_start, f"{len(after_start)} kernel variants built while serving:\n" + "\n".join(after_start)
