"""Quantized checkpoints on a CUDA GPU (GPU only; skipped elsewhere): the engine with the Triton quantized
GEMMs and CUDA graphs against the same engine on the torch references, same GPU, fp32 activations: the same
greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tokenizer_dir
from tests.engine.quant_checkpoints import FORMATS, build_quantized_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _engine(model_dir: Path, kernels: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(num_kv_tokens=4096),
            scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=96),
            device="cuda",
            kernels=kernels,
        )
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_triton_quantized_engine_matches_the_torch_references(fmt: str, request, tmp_path: Path) -> None:
    build_quantized_checkpoint(fmt, tmp_path / fmt, tokenizer_dir(request))
    prompts = random_prompts(6, 49152, 3, 70, seed=FORMATS.index(fmt))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = run_staggered(_engine(tmp_path / fmt, "torch"), prompts, params, [0, 0, 1, 2, 3, 5])
    engine = _engine(tmp_path / fmt, "auto")
    assert run_staggered(engine, prompts, params, [0, 0, 1, 2, 3, 5]) == want
