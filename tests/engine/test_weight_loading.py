"""Checkpoint resolution and loading: errors that name their file, the Hub offline,
GGUF conversion details, and dummy weights for the benchmark configs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.model_loader import load_model
from engine.weights.errors import CheckpointError
from engine.weights.gguf import convert_gguf, unpermute_rotary_rows
from tests.engine.checkpoints import build_tiny_checkpoint
from tests.engine.model_harness import PagedHarness

CPU = torch.device("cpu")
BENCH_CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
# Published parameter counts: they pin both the JSON files and our module shapes.
BENCH_MODELS = {
    "Llama-3.2-1B": ("LlamaForCausalLM", 1_235_814_400),
    "Llama-3.1-8B": ("LlamaForCausalLM", 8_030_261_248),
    "Llama-3.1-70B": ("LlamaForCausalLM", 70_553_706_496),  # the tensor-parallel benchmark's 4-GPU shape
    "Qwen3-0.6B": ("Qwen3ForCausalLM", 596_049_920),
    "Qwen2.5-0.5B": ("Qwen2ForCausalLM", 494_032_768),
    "SmolLM2-135M": ("LlamaForCausalLM", 134_515_008),  # the packaged default model's shape
    "Qwen1.5-MoE-A2.7B": ("Qwen2MoeForCausalLM", 14_315_784_192),
    "Qwen3-30B-A3B": ("Qwen3MoeForCausalLM", 30_532_122_624),
    "Mixtral-8x7B": ("MixtralForCausalLM", 46_702_792_704),
}


def load(model_dir: Path | str, **config: object) -> torch.nn.Module:
    return load_model(ModelConfig(model=str(model_dir), **config), CPU, torch.float32).model


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


# --- errors name the file at fault ---------------------------------------------------


def test_missing_shard_is_named(smollm2_dir: Path, tmp_path: Path) -> None:
    model_dir = build_tiny_checkpoint("llama", tmp_path / "sharded", smollm2_dir, max_shard_size="200KB")
    shard = sorted(model_dir.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load(model_dir)


def test_directory_without_weights_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "config-only"
    model_dir.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", model_dir)
    with pytest.raises(CheckpointError, match="no safetensors checkpoint in .*config-only"):
        load(model_dir)


def test_corrupt_header_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_checkpoint(tiny_llama_dir, tmp_path / "corrupt")
    with open(model_dir / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 16)  # the header length and the start of the JSON header
    with pytest.raises(CheckpointError, match=r"corrupt/model\.safetensors"):
        load(model_dir)


def test_truncated_file_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_checkpoint(tiny_llama_dir, tmp_path / "truncated")
    path = model_dir / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(CheckpointError, match=r"truncated/model\.safetensors"):
        load(model_dir)


def test_missing_tensor_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_checkpoint(tiny_llama_dir, tmp_path / "incomplete")
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.qkv_proj\.weight\[k\]"):
        load(model_dir)


def test_config_that_does_not_fit_the_weights(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_checkpoint(tiny_llama_dir, tmp_path / "mismatch")
    config = json.loads((model_dir / "config.json").read_text())
    config["intermediate_size"] = 96
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"mlp\.(gate|up|down)_proj\.weight' has shape .*LlamaForCausalLM expects"):
        load(model_dir)


def test_unknown_hub_id_offline_names_the_id() -> None:
    with pytest.raises(CheckpointError, match="inferq-test/no-such-model"):
        load("inferq-test/no-such-model")


def test_missing_local_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nowhere"):
        load(tmp_path / "nowhere" / "model")
    with pytest.raises(CheckpointError, match=r"missing\.gguf"):
        load(tmp_path / "missing.gguf")


def test_max_model_len_beyond_the_checkpoint(tiny_llama_dir: Path) -> None:
    assert (
        load_model(ModelConfig(model=str(tiny_llama_dir), max_model_len=100), CPU, torch.float32).max_model_len == 100
    )
    with pytest.raises(ValueError, match=r"max_model_len \(1025\) exceeds .* 1024"):
        load(tiny_llama_dir, max_model_len=1025)


# --- GGUF -------------------------------------------------------------------------


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (what the converter undoes)."""
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("num_heads", [1, 3, 4])
def test_unpermute_inverts_llama_cpp(num_heads: int) -> None:
    weights = np.random.default_rng(0).standard_normal((num_heads * 8, 5)).astype(np.float32)
    assert np.array_equal(unpermute_rotary_rows(llama_cpp_permute(weights, num_heads), num_heads), weights)


def test_gguf_conversion_is_cached_and_complete(smollm2_dir: Path, inferq_cache_dir: Path) -> None:
    from engine.weights.default_model import default_gguf_path

    assert convert_gguf(default_gguf_path(), inferq_cache_dir) == smollm2_dir
    assert not [p for p in inferq_cache_dir.iterdir() if ".tmp-" in p.name]  # no half-written leftovers
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 49152
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (smollm2_dir / name).is_file(), name


def test_not_a_gguf_file_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match=r"bogus\.gguf"):
        convert_gguf(bogus, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())  # the temporary directory is gone


# --- dummy weights for the benchmark configs --------------------------------------


@pytest.mark.parametrize("name", sorted(BENCH_MODELS))
def test_bench_config_builds_on_meta(name: str) -> None:
    loaded = load_model(
        ModelConfig(model=str(BENCH_CONFIGS / name), load_format="dummy"), torch.device("meta"), torch.bfloat16
    )
    class_name, num_params = BENCH_MODELS[name]
    model = loaded.model
    assert type(model).__name__ == class_name
    assert sum(p.numel() for p in model.parameters()) == num_params
    config = loaded.hf_config
    qkv_rows = (config.num_attention_heads + 2 * config.num_key_value_heads) * model.head_dim
    assert model.model.layers[0].self_attn.qkv_proj.weight.shape == (qkv_rows, config.hidden_size)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def shrunk_config_dir(name: str, target: Path) -> Path:
    """The bench config at tiny scale: same architecture and rope, small shapes."""
    config = json.loads((BENCH_CONFIGS / name / "config.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=512)
    config.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if "head_dim" in config:
        config["head_dim"] = 32
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("name", sorted(BENCH_MODELS))
def test_dummy_weights_run_at_tiny_scale(name: str, tmp_path: Path) -> None:
    model_dir = shrunk_config_dir(name, tmp_path / name)
    model = load(model_dir, load_format="dummy", seed=3)
    logits = PagedHarness(model).step({"a": list(range(40)), "b": [7, 8, 9]})
    for rows in logits.values():
        assert torch.isfinite(rows).all()
        assert 0.1 < rows.std().item() < 10  # sane scale: neither collapsed nor exploding
    same, other = load(model_dir, load_format="dummy", seed=3), load(model_dir, load_format="dummy", seed=4)
    for (param_name, param), same_param, other_param in zip(
        model.named_parameters(), same.parameters(), other.parameters(), strict=True
    ):
        assert torch.equal(param, same_param), param_name
        if param.dim() == 2:
            assert not torch.equal(param, other_param), param_name


def test_dummy_needs_only_config(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    model_dir = tmp_path / "gpt2-config-only"
    model_dir.mkdir()
    shutil.copy(tiny_checkpoint("gpt2") / "config.json", model_dir)
    model = load(model_dir, load_format="dummy")
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert torch.isfinite(PagedHarness(model).step({"a": [1, 2, 3]})["a"]).all()
