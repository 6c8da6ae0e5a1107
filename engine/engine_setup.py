"""Turning an EngineConfig into the engine's device, dtype and ModelRunner: what LLMEngine and every other
rank of a tensor-parallel group (engine/parallel/follower.py) build alike."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.model_runner import ModelRunner
from engine.parallel.group import SINGLE, TensorParallel


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def build_model_runner(
    config: EngineConfig, model: torch.nn.Module, device: torch.device, dtype: torch.dtype, max_model_len: int,
    tp: TensorParallel = SINGLE, num_kv_tokens: int | None = None, draft: bool = False,
) -> ModelRunner:  # fmt: skip
    """The engine's ModelRunner; every rank of a tensor-parallel group builds it from the same config, and a draft
    model's the same way with its own pool size (`num_kv_tokens`, else the config's) and no verification steps
    (`draft`: its runner only decodes, so its decode attention has one fresh key a row)."""
    sched = config.scheduler
    verifies = config.speculative.method is not None and not draft
    return ModelRunner(
        model,
        device,
        dtype,
        block_size=config.cache.block_size,
        num_kv_tokens=num_kv_tokens if num_kv_tokens is not None else config.cache.num_kv_tokens,
        gpu_memory_utilization=config.cache.gpu_memory_utilization,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=max_model_len,
        step_graphs=step_graphs(config),
        tp=tp,
        num_speculative_tokens=config.speculative.num_speculative_tokens if verifies else 0,
    )


def step_graphs(config: EngineConfig) -> str:
    """ModelRunner's step_graphs: captured graphs; or, for enforce_eager, the same padded steps run eagerly
    (built at start, not inside served steps); the torch-reference kernels read sequence lengths on the
    host, which a padded step's buffers hold only as placeholders, so they run every step at its own size."""
    if config.kernels == "torch":
        return "off"
    return "eager" if config.enforce_eager else "capture"
