"""From a ModelConfig to a model with weights, on a device, in a dtype.

`model` may be a packaged model's short name ("default": SmolLM2, "gemma3-270m": Gemma 3 270M), a
`.gguf` file, a local checkpoint directory or a Hugging Face Hub id; GGUF files are converted once to a
checkpoint directory (see engine/weights/gguf.py), so every path ends in one place:
a directory with config.json, safetensors and tokenizer files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.config import ModelConfig
from engine.models.registry import resolve_model_class
from engine.parallel.group import SINGLE, TensorParallel, building_for
from engine.quantization.checkpoint_stream import regroup_quantized
from engine.quantization.model_build import check_quantized_model, initialize_dummy_quantized, quantized_linears
from engine.quantization.selection import select_quantization
from engine.weights.dummy import initialize_dummy_weights
from engine.weights.errors import CheckpointError
from engine.weights.gguf import convert_gguf, default_cache_dir
from engine.weights.hub import download_checkpoint, looks_like_hub_id
from engine.weights.packaged_models import PACKAGED_MODELS, packaged_gguf_path
from engine.weights.safetensors import checkpoint_files, iterate_weights


@dataclass
class LoadedModel:
    """What load_model returns.

    Args:
        model: the model, in eval mode, parameters on the device in the dtype.
        hf_config: the checkpoint's transformers config.
        model_dir: the checkpoint directory (tokenizer and generation config live there).
        max_model_len: the longest sequence served (the ModelConfig's, else the checkpoint's).
    """

    model: nn.Module
    hf_config: Any
    model_dir: Path
    max_model_len: int


def load_model(
    model_config: ModelConfig, device: torch.device, dtype: torch.dtype, cache_dir: str | None = None,
    tp: TensorParallel = SINGLE,
) -> LoadedModel:  # fmt: skip
    """Builds the model of `model_config` and loads its weights.

    Args:
        model_config: which checkpoint, load format, max_model_len and dummy seed.
        device: where parameters live; torch.device("meta") builds shapes only (dummy).
        dtype: parameter dtype (the rotary table stays float32).
        cache_dir: root of converted GGUF checkpoints; None is ~/.cache/inferq/models.
        tp: the tensor-parallel rank to build: each layer holds its shard and loads its part of each tensor.

    Raises:
        CheckpointError: the checkpoint cannot be found, fetched, read or converted.
        ValueError: an unsupported architecture, weights that do not fit the config, or a
            max_model_len beyond the checkpoint's.
    """
    model_dir = resolve_model_dir(model_config, cache_dir)
    hf_config = language_config(load_hf_config(model_dir))
    max_model_len = resolve_max_model_len(hf_config, model_config.max_model_len)
    model_class = resolve_model_class(hf_config)
    quantization = select_quantization(hf_config, model_config.quantization, device)
    if tp.enabled:
        check_tensor_parallel(model_class, hf_config, quantization is not None and quantization.checkpoint is not None)
    with (
        _default_device_and_dtype(device, dtype),
        quantized_linears(quantization and quantization.scheme),
        building_for(tp),
    ):
        model = model_class(hf_config)
    if quantization is not None:
        check_quantized_model(model, quantization.setting)
    if model_config.load_format == "dummy":
        initialize_dummy_weights(model, model_config.seed)
        initialize_dummy_quantized(model, model_config.seed)
    else:
        weights = iterate_weights(checkpoint_files(model_dir))
        if quantization is not None and quantization.checkpoint is not None:
            weights = regroup_quantized(weights, quantization.checkpoint)
        model.load_weights(weights)
    if quantization is not None and device.type == "cuda":
        # quantizing at load made one layer's fp32 temporaries at a time: no part of what serving needs, and the KV
        # pool is sized from torch's reserved peak (engine/kv_cache.py), so that peak starts again here
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model.eval()
    return LoadedModel(model=model, hf_config=hf_config, model_dir=model_dir, max_model_len=max_model_len)


def check_tensor_parallel_model(model_config: ModelConfig, size: int, cache_dir: str | None = None) -> None:
    """What check_tensor_parallel refuses, and heads that do not divide over `size` ranks, from config.json
    alone: rank 0 checks it before it starts the other ranks, so a refusal is one clear error, not N.

    Raises:
        ValueError: as check_tensor_parallel, or heads that do not divide.
    """
    hf_config = language_config(load_hf_config(resolve_model_dir(model_config, cache_dir)))
    checkpoint = getattr(hf_config, "quantization_config", None) is not None
    check_tensor_parallel(resolve_model_class(hf_config), hf_config, checkpoint)
    num_heads = hf_config.num_attention_heads
    TensorParallel(0, size).heads(num_heads, getattr(hf_config, "num_key_value_heads", None) or num_heads)


def check_tensor_parallel(model_class: type, hf_config: Any, prequantized: bool) -> None:
    """Refuses, before anything is built, what a tensor-parallel rank cannot hold.

    Raises:
        ValueError: the architecture has no tensor-parallel build, or the checkpoint is pre-quantized.
    """
    architecture = (getattr(hf_config, "architectures", None) or [model_class.__name__])[0]
    if not getattr(model_class, "supports_tensor_parallel", False):
        raise ValueError(
            f"tensor_parallel_size > 1 does not support architecture {architecture!r} "
            "(supported: the Llama, Mistral, Qwen2, Qwen3, Gemma 3, Qwen2-MoE, Qwen3-MoE and Mixtral families)"
        )
    if prequantized:
        config = getattr(hf_config, "quantization_config", None)
        method = config.get("quant_method", "?") if isinstance(config, dict) else getattr(config, "quant_method", "?")
        raise ValueError(
            f"tensor_parallel_size > 1 does not load pre-quantized checkpoints (quantization_config.quant_method "
            f"{method!r}): run them with tensor_parallel_size 1, or quantize a dense checkpoint at load "
            "(--quantization)"
        )


def resolve_model_dir(model_config: ModelConfig, cache_dir: str | None = None) -> Path:
    """The local checkpoint directory of `model_config.model`, converting or downloading it."""
    model, load_format = model_config.model, model_config.load_format
    if model in PACKAGED_MODELS:
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return convert_gguf(packaged_gguf_path(model, root), cache_dir)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if load_format == "safetensors":
            raise ValueError(f"load_format 'safetensors' does not fit the GGUF file {path}")
        return convert_gguf(path, cache_dir)
    if path.is_dir():
        if load_format == "gguf":
            return convert_gguf(_single_gguf_in(path), cache_dir)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model directory {path} has no config.json")
        return path
    if path.exists():
        raise CheckpointError(f"model {path} is a file but not a .gguf file; pass a checkpoint directory")
    if looks_like_hub_id(model):
        return download_checkpoint(model, model_config.revision, weights=load_format != "dummy")
    raise CheckpointError(f"model {model!r} is neither an existing path nor a Hugging Face Hub id")


def _single_gguf_in(directory: Path) -> Path:
    files = sorted(directory.glob("*.gguf"))
    if len(files) != 1:
        raise CheckpointError(f"load_format 'gguf' needs exactly one .gguf file in {directory}, found {len(files)}")
    return files[0]


def load_hf_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError for bad configs
        raise CheckpointError(f"cannot read {model_dir / 'config.json'}: {exc}") from exc


def language_config(hf_config: Any) -> Any:
    """The config the engine sizes itself from: a multimodal checkpoint's `text_config` (served text-only:
    Gemma3ForConditionalGeneration), carrying the checkpoint's architecture and special token ids; any other
    config as it is."""
    text_config = getattr(hf_config, "text_config", None)
    if text_config is None:
        return hf_config
    text_config.architectures = list(getattr(hf_config, "architectures", None) or [])
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if getattr(text_config, name, None) is None and getattr(hf_config, name, None) is not None:
            setattr(text_config, name, getattr(hf_config, name))
    return text_config


def checkpoint_max_len(hf_config: Any) -> int:
    """The checkpoint's position limit (max_position_embeddings, or n_positions for GPT-2)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(hf_config, name, None)
        if value:
            return int(value)
    raise ValueError("config.json has neither max_position_embeddings nor n_positions")


def resolve_max_model_len(hf_config: Any, requested: int | None) -> int:
    limit = checkpoint_max_len(hf_config)
    if requested is None:
        return limit
    if requested > limit:
        raise ValueError(f"max_model_len ({requested}) exceeds the checkpoint's limit of {limit} positions")
    return requested


@contextlib.contextmanager
def _default_device_and_dtype(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Parameters are created where and as they will live (no fp32 copy on the host first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)
