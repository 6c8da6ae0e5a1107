"""The model's sampling defaults (generation_config.json), applied where a request is silent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import ModelConfig
from engine.generation_defaults import GenerationDefaults
from engine.sampling_params import SamplingParams
from engine.weights.default_model import GENERATION_CONFIG, default_gguf_path, packaged_generation_config
from engine.weights.errors import CheckpointError

# Qwen2.5-Instruct's sampling, plus fields the engine must not read.
QWEN_LIKE = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "min_p": 0.05,
    "max_new_tokens": 300,
    "max_length": 20,
    "typical_p": 0.5,
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
}


def checkpoint_with(tmp_path: Path, generation_config: dict | str) -> Path:
    text = generation_config if isinstance(generation_config, str) else json.dumps(generation_config)
    (tmp_path / "generation_config.json").write_text(text)
    return tmp_path


def test_reads_the_five_sampling_fields_and_max_new_tokens(tmp_path: Path) -> None:
    defaults = GenerationDefaults.from_checkpoint(checkpoint_with(tmp_path, QWEN_LIKE))
    assert dict(defaults.values) == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.05,
        "max_tokens": 300,
    }
    assert defaults.max_tokens == 300
    assert "temperature=0.7" in defaults.describe() and "max_tokens=300" in defaults.describe()


def test_fields_a_request_sets_win_and_the_rest_are_the_models(tmp_path: Path) -> None:
    defaults = GenerationDefaults.from_checkpoint(checkpoint_with(tmp_path, QWEN_LIKE))
    silent = defaults.sampling_params({})
    assert (silent.temperature, silent.top_p, silent.top_k, silent.min_p) == (0.7, 0.8, 20, 0.05)
    assert (silent.repetition_penalty, silent.max_tokens) == (1.05, 300)
    chosen = defaults.sampling_params({"temperature": 0, "max_tokens": 5, "seed": 3, "top_k": -1})
    assert (chosen.temperature, chosen.max_tokens, chosen.seed, chosen.top_k) == (0, 5, 3, -1)
    assert (chosen.top_p, chosen.min_p, chosen.repetition_penalty) == (0.8, 0.05, 1.05)
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got 1.5"):
        defaults.sampling_params({"top_p": 1.5})  # the request's own bad field is still refused


def test_none_mode_and_a_missing_file_keep_sampling_params_defaults(tmp_path: Path) -> None:
    none = GenerationDefaults.from_checkpoint(checkpoint_with(tmp_path, QWEN_LIKE), mode="none")
    assert none.values == {} and none.max_tokens is None
    assert none.sampling_params({"seed": 1}) == SamplingParams(seed=1)
    missing = GenerationDefaults.from_checkpoint(tmp_path / "nowhere")
    assert missing.values == {} and missing.sampling_params({}) == SamplingParams()
    only_ids = GenerationDefaults.from_checkpoint(checkpoint_with(tmp_path, {"bos_token_id": 1, "eos_token_id": 2}))
    assert only_ids.values == {}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"top_p": 0.0}, r"top_p must be a number in \(0, 1\], got 0.0"),
        ({"temperature": -1}, r"temperature must be a number in \[0, 2\], got -1"),
        ({"max_new_tokens": 0}, r"max_tokens must be an integer in \[1, 2\*\*31 - 1\], got 0"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ("{not json", "cannot read"),
    ],
)
def test_a_bad_file_is_named_with_its_field(tmp_path: Path, config: dict | str, message: str) -> None:
    with pytest.raises(CheckpointError, match=message) as error:
        GenerationDefaults.from_checkpoint(checkpoint_with(tmp_path, config))
    assert "generation_config.json" in str(error.value)
    if not isinstance(config, str):
        assert "--generation-defaults none" in str(error.value)


def test_the_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="generation_defaults must be one of"):
        ModelConfig(generation_defaults="auto")
    with pytest.raises(ValueError, match="generation defaults must be one of"):
        GenerationDefaults.from_checkpoint(".", mode="vllm")


def test_the_packaged_smollm2_samples_as_its_authors_recommend(smollm2_dir: Path) -> None:
    written = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert (written["temperature"], written["top_p"], written["max_new_tokens"]) == (0.2, 0.9, 512)
    assert written["eos_token_id"] == 2  # the special ids stay
    defaults = GenerationDefaults.from_checkpoint(smollm2_dir)
    assert dict(defaults.values) == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 512}
    assert GENERATION_CONFIG == {"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 512}


def test_only_the_packaged_gguf_gets_its_recommendation(tmp_path: Path) -> None:
    assert packaged_generation_config(default_gguf_path()) == GENERATION_CONFIG
    other = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"  # same name, another file
    other.write_bytes(b"GGUF")
    assert packaged_generation_config(other) == {}
