"""The engine on a CUDA GPU against its references (GPU only; skipped elsewhere).

1. Triton kernels (with decode CUDA graphs) vs the torch-reference kernels, same engine,
   same GPU, the tiny fp32 checkpoints: the same greedy tokens, logprobs within 1e-3.
2. bf16: the engine model's logits within bf16 tolerance of transformers, both measured
   against transformers in fp32: our error may be at most twice transformers' own bf16 error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine import ops
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.model_loader import load_model
from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import ARCHITECTURES
from tests.engine.engine_helpers import random_prompts
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory
from tests.engine.model_harness import PagedHarness
from tests.engine.test_cuda_graphs import ARRIVALS, assert_same_outputs, run_with_logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def gpu_tiny_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return tiny_checkpoint_factory(request, tmp_path_factory)


def _engine(model_dir: Path, kernels: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(num_kv_tokens=4096),
            scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=96),  # chunked prefills mix in
            device="cuda",
            kernels=kernels,
        )
    )


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_triton_engine_matches_the_torch_reference_engine(kind: str, gpu_tiny_checkpoint: Callable) -> None:
    model_dir = gpu_tiny_checkpoint(kind)
    prompts = random_prompts(len(ARRIVALS), 49152, 3, 70, seed=ARCHITECTURES.index(kind))
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=0)
    reference = run_with_logprobs(_engine(model_dir, "torch"), prompts, params, ARRIVALS)
    engine = _engine(model_dir, "auto")
    assert engine.runner.graphs is not None  # the Triton path runs decode through CUDA graphs
    assert_same_outputs(run_with_logprobs(engine, prompts, params, ARRIVALS), reference, tol=1e-3)
    assert engine.runner.graphs.num_replays > 0


def _relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3", "mistral_window"])
def test_bf16_logits_within_bf16_tolerance_of_transformers(kind: str, gpu_tiny_checkpoint: Callable) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = gpu_tiny_checkpoint(kind)
    device = torch.device("cuda")
    prompt = random_prompts(1, 49152, 50, 50, seed=1)[0]
    continuation = random_prompts(1, 49152, 6, 6, seed=2)[0]
    ids = torch.tensor([prompt + continuation], device=device)

    def hf_logits(dtype: torch.dtype) -> torch.Tensor:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        with torch.no_grad():
            return hf(ids).logits[0].float()  # [T, V]

    reference, hf_bf16 = hf_logits(torch.float32), hf_logits(torch.bfloat16)
    loaded = load_model(ModelConfig(model=str(model_dir), dtype="bfloat16"), device, torch.bfloat16)
    with ops.kernel_backend("auto"):
        harness = PagedHarness(loaded.model)
        ours = [harness.step({"s": prompt})["s"]]  # prefill: logits of every prompt position
        ours += [harness.step({"s": [token]})["s"] for token in continuation]  # decodes
    ours_logits = torch.cat(ours)  # [T, V]
    hf_error = _relative_error(hf_bf16, reference)
    our_error = _relative_error(ours_logits, reference)
    assert hf_error < 5e-2
    assert our_error <= 2 * hf_error + 1e-3, (our_error, hf_error)
