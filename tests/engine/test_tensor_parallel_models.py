"""Tensor parallelism on CPU (gloo): every family that supports it, split over 2 and 4 ranks, gives the logits
of one rank within 1e-4 and the same greedy tokens, over paged prefill, decode and mixed steps.

The tiny checkpoints (tests/engine/checkpoints.py) have 4 query heads over 2 KV heads, so 4 ranks replicate
each KV head on two ranks; their vocabulary (49,152) splits evenly, so an untied embedding is vocabulary-
parallel; the MoE checkpoints cover a shared expert (Qwen2-MoE), a dense layer among sparse ones (Qwen3-MoE)
and both expert layouts.

Quantized at load, a row-parallel projection's per-channel (or per-group) scales cover its rank's columns only,
so 2 ranks quantize differently from one: the test holds their error against the unquantized logits to that of
one rank (docs/tensor-parallelism.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from engine.config import ModelConfig
from engine.model_loader import load_model
from engine.parallel.group import TensorParallel
from tests.engine.checkpoints import build_tiny_checkpoint
from tests.engine.tp_ranks import model_logits_rank

ATOL = 1e-4
QUANTIZATIONS = ("int8", "int4", "fp8")
KINDS = (
    "llama",
    "llama3_tied",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "mistral_window",
    "qwen2_moe",
    "qwen3_moe",
    "mixtral",
)


def run_ranks(size: int, model_dirs: list[Path] | list[str], tmp_path: Path) -> dict[str, dict]:
    """Spawns `size` gloo ranks over the checkpoints (tp_ranks.model_logits_rank's entries); returns rank 0's
    outputs by entry."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / f"tp{size}.pt"
    rendezvous = f"file://{tmp_path / f'rendezvous{size}'}"
    mp.start_processes(
        model_logits_rank, args=(size, rendezvous, [str(d) for d in model_dirs], str(out)), nprocs=size,
        join=True, start_method="spawn",
    )  # fmt: skip
    return torch.load(out)


@pytest.fixture(scope="module")
def model_dirs(
    tiny_checkpoint: Callable[[str], Path], smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[Path]:
    dirs = [tiny_checkpoint(kind) for kind in KINDS]
    # the MoE families' packed expert layout too (transformers 5's experts.gate_up_proj / down_proj)
    for kind in ("qwen2_moe", "mixtral"):
        out_dir = tmp_path_factory.mktemp(f"tp-packed-{kind}")
        dirs.append(build_tiny_checkpoint(kind, out_dir, smollm2_dir, expert_layout="packed"))
    return dirs


@pytest.fixture(scope="module")
def one_rank(model_dirs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return run_ranks(1, model_dirs, tmp_path_factory.mktemp("tp1"))


def test_two_ranks_quantized_at_load_err_as_one_rank_does(tiny_checkpoint, tmp_path):
    llama = str(tiny_checkpoint("llama"))
    entries = [llama] + [f"{llama}@{q}" for q in QUANTIZATIONS]
    one = run_ranks(1, entries, tmp_path / "one")
    two = run_ranks(2, [f"{llama}@{q}" for q in QUANTIZATIONS], tmp_path / "two")
    exact = one[llama]["logits"]
    for q in QUANTIZATIONS:
        err_one = (one[f"{llama}@{q}"]["logits"] - exact).abs()
        err_two = (two[f"{llama}@{q}"]["logits"] - exact).abs()
        assert err_one.mean() > 0, q  # the scheme changed the weights at all
        assert err_two.mean() <= 1.25 * err_one.mean(), (q, err_two.mean().item(), err_one.mean().item())
        assert err_two.max() <= 1.5 * err_one.max(), (q, err_two.max().item(), err_one.max().item())


@pytest.mark.parametrize("size", [2, 4])
def test_ranks_give_the_logits_and_tokens_of_one_rank(size, model_dirs, one_rank, tmp_path):
    split = run_ranks(size, model_dirs, tmp_path)
    for model_dir in map(str, model_dirs):
        reference, ours = one_rank[model_dir], split[model_dir]
        assert ours["logits"].shape == reference["logits"].shape
        close = torch.isclose(ours["logits"], reference["logits"], atol=ATOL, rtol=0)
        worst = (ours["logits"] - reference["logits"]).abs().max().item()
        assert bool(close.all()), f"{model_dir}: logits differ by up to {worst:.2e}"
        assert ours["tokens"] == reference["tokens"], model_dir


def test_a_rank_holds_its_share_of_every_sharded_parameter(tiny_checkpoint):
    """Rank 1 of 2 holds half of each column- or row-parallel projection and of the untied embedding, one of
    the 2 KV heads, and the whole LM head (replicated, decision 0061)."""
    tp = TensorParallel(rank=1, size=2, group=None)
    model = load_model(ModelConfig(model=str(tiny_checkpoint("llama")), load_format="dummy"), torch.device("cpu"),
                       torch.float32, tp=tp).model  # fmt: skip
    layer = model.model.layers[0]
    assert (layer.self_attn.num_heads, layer.self_attn.num_kv_heads, model.num_kv_heads) == (2, 1, 1)
    assert tuple(layer.self_attn.qkv_proj.weight.shape) == ((2 + 1 + 1) * 16, 64)
    assert layer.self_attn.qkv_proj.shard_sources == {"q": (32, 32), "k": (16, 16), "v": (16, 16)}
    assert tuple(layer.self_attn.o_proj.weight.shape) == (64, 32)
    assert tuple(layer.mlp.gate_up_proj.weight.shape) == (128, 64)
    assert tuple(layer.mlp.down_proj.weight.shape) == (64, 64)
    assert tuple(model.model.embed_tokens.weight.shape) == (49152 // 2, 64)
    assert tuple(model.lm_head.weight.shape) == (49152, 64)


@pytest.mark.parametrize(
    "kind,message",
    [("olmoe", "does not support architecture 'OlmoeForCausalLM'"), ("gpt2", "does not support architecture 'GPT2")],
)
def test_families_without_a_tensor_parallel_build_are_refused_by_name(kind, message, tiny_checkpoint):
    config = ModelConfig(model=str(tiny_checkpoint(kind)), load_format="dummy")
    with pytest.raises(ValueError, match=message):
        load_model(config, torch.device("cpu"), torch.float32, tp=TensorParallel(rank=0, size=2, group=None))


def test_heads_that_do_not_divide_over_the_ranks_are_refused_by_name(tiny_checkpoint):
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be divisible by tensor_parallel_size \(3\)"):
        load_model(ModelConfig(model=str(tiny_checkpoint("llama")), load_format="dummy"), torch.device("cpu"),
                   torch.float32, tp=TensorParallel(rank=0, size=3, group=None))  # fmt: skip
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\)"):
        TensorParallel(rank=0, size=2).heads(6, 3)
