"""Fixtures of the worker tests: a private Redis, the tiny Llama checkpoint, CPU-friendly threads."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix, so tests sharing one Redis never see each other's keys."""
    return f"t{secrets.token_hex(4)}"


@pytest.fixture(scope="session")
def worker_model_dir(tiny_llama_dir: Path) -> Path:
    """The tiny random Llama (real SmolLM2 tokenizer) from tests/engine/checkpoints.py."""
    return tiny_llama_dir


@pytest.fixture
def engine(request, worker_model_dir):
    """The CPU engine of the in-process worker tests (a module may define its own); tests parametrized with
    indirect=True pick async scheduling (the GPU default)."""
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SchedulerConfig

    config = EngineConfig(
        model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
        cache=CacheConfig(num_kv_tokens=4096),
        scheduler=SchedulerConfig(max_num_seqs=32, policy="priority"),
        device="cpu",
        async_scheduling=getattr(request, "param", False),
    )
    return LLMEngine(config)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core box run ~10x faster on one thread (no OpenMP spin contention),
    and in-process workers share the box with worker subprocesses."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
