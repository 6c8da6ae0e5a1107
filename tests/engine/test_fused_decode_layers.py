"""Batch-1 decode with every one-token projection on the GEMV kernels and the pre-norms, residual adds
and SwiGLU fused into them (engine.ops.rms_norm_linear, kernels/rms_norm_gemv.py), and with the qkv
projection's RoPE and KV store fused in too (engine.ops.QKV_ROPE_FUSION), against the engine on the
torch references: the same greedy tokens.

The dispatch thresholds (engine.ops.GEMV_MIN_FEATURES, NORM_GEMV_MIN_FEATURES, with PDL or not) are lowered to the
tiny checkpoints' sizes, so that their projections take the path the Llama-3.1-8B shape takes. On
the CPU the kernels run in Triton's interpreter, eagerly; on a GPU for real, through the batch-1
CUDA graph with async scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import kernels.gemv_rows
import kernels.rms_norm_gemv
import kernels.rms_norm_qkv_rope
from engine import ops
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory

ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    return tiny_checkpoint_factory(request, tmp_path_factory)


def _engine(model_dir: Path, kernels: str) -> LLMEngine:
    if not ON_GPU:
        return make_engine(model_dir, kernels=kernels)
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(num_kv_tokens=4096),
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
            device="cuda",
            kernels=kernels,
            enforce_eager=kernels == "torch",  # the reference: eager, synchronous steps
            async_scheduling=kernels != "torch",
        )
    )


def _one_token_kernels_everywhere(monkeypatch) -> None:
    """The dispatch thresholds lowered to the tiny checkpoints' sizes (see the module docstring)."""
    monkeypatch.setattr(ops, "GEMV_MIN_FEATURES", 1)
    monkeypatch.setattr(ops, "GEMV_MIN_FEATURES_PDL", 1)  # the threshold where kernels launch with PDL
    monkeypatch.setattr(ops, "NORM_GEMV_MIN_FEATURES", 1)
    monkeypatch.setattr(ops, "NORM_GEMV_MIN_FEATURES_PDL", 1)
    if not ON_GPU:
        # NOTE: the interpreter runs one Python loop per program: the LM head's 49152 rows would take
        # 12288 programs a step. It stays a matmul here; the decoder layers' projections do not.
        one_token = ops.uses_gemv
        monkeypatch.setattr(ops, "uses_gemv", lambda x, w, *least: w.shape[0] < 4096 and one_token(x, w, *least))


def _counting(monkeypatch, module, name: str) -> list:
    """Calls of module.name from now on, one entry each."""
    calls, kernel = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    return calls


def _fused_run_matches_the_reference(kind: str, tiny_ckpt, monkeypatch, seed: int, counted) -> list:
    """Greedy tokens of two staggered requests on the one-token kernels equal the torch engine's; returns
    the calls of `counted` (module, name) in the kernel run. r0 decodes alone (one token a step: the fused
    path), then r1's prefill and the pair's decodes (several tokens a step: the norm kernels and matmuls)."""
    model_dir = tiny_ckpt(kind)
    prompts = random_prompts(2, 49152, 5, 20, seed=seed)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    arrivals = [0, 5]
    reference = run_staggered(_engine(model_dir, "torch"), prompts, params, arrivals)
    _one_token_kernels_everywhere(monkeypatch)
    calls = _counting(monkeypatch, *counted)
    engine = _engine(model_dir, "triton")
    assert run_staggered(engine, prompts, params, arrivals) == reference
    if ON_GPU:
        assert engine.runner.graphs is not None and engine.runner.graphs.num_replays > 0
    return calls


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])  # plain, q/k/v biases, q/k norms
def test_fused_one_token_layers_give_the_reference_tokens(kind: str, tiny_ckpt, monkeypatch) -> None:
    """The norm-fused projections with RoPE + KV store as their own kernel (QKV_ROPE_FUSION off: the path
    Qwen3 and engines with it off take)."""
    monkeypatch.setattr(ops, "QKV_ROPE_FUSION", False)
    calls = _fused_run_matches_the_reference(kind, tiny_ckpt, monkeypatch, 13, (kernels.rms_norm_gemv, "rms_norm_gemv"))
    assert calls, "no one-token step went through the fused kernel"


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_qkv_projection_with_rope_and_kv_store_in_one_kernel_gives_the_reference_tokens(
    kind: str, tiny_ckpt, monkeypatch
) -> None:
    """engine.ops.QKV_ROPE_FUSION (kernels/rms_norm_qkv_rope.py): Llama and Qwen2 (q/k/v biases) take it
    at one token; Qwen3 keeps the unfused pair, whose kernel also applies its q/k norms."""
    monkeypatch.setattr(ops, "QKV_ROPE_FUSION", True)
    counted = (kernels.rms_norm_qkv_rope, "rms_norm_qkv_rope")
    calls = _fused_run_matches_the_reference(kind, tiny_ckpt, monkeypatch, 17, counted)
    assert bool(calls) is (kind != "qwen3")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # plain, q/k/v biases
def test_a_few_sequences_take_the_few_rows_kernels_and_give_the_reference_tokens(kind: str, tiny_ckpt) -> None:
    """Decode steps of 2..4 sequences through kernels/gemv_rows.py (engine.ops.uses_gemv_rows: the tiny
    checkpoint's projections are small weights), the norms and SwiGLU fused into them, requests staggered so that
    steps of 2, 3 and 4 rows occur (on a GPU through the decode buckets' graphs): the torch engine's tokens."""
    model_dir = tiny_ckpt(kind)
    prompts = random_prompts(4, 49152, 5, 20, seed=19)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    arrivals = [0, 2, 4, 6]
    reference = run_staggered(_engine(model_dir, "torch"), prompts, params, arrivals)
    rows_seen = []
    normed = kernels.gemv_rows.rms_norm_gemv_rows
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            kernels.gemv_rows,
            "rms_norm_gemv_rows",
            lambda x, *a, **kw: rows_seen.append(x.shape[0]) or normed(x, *a, **kw),
        )
        assert run_staggered(_engine(model_dir, "triton"), prompts, params, arrivals) == reference
    assert {2, 4} <= set(rows_seen), (
        f"steps of 2 and 4 rows did not take the few-rows kernels: {sorted(set(rows_seen))}"
    )
