"""Fixtures shared by every engine test: the packaged SmolLM2 converted once per
session, and tiny random checkpoints of each architecture, each built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine.checkpoints import ARCHITECTURES, build_tiny_checkpoint


@pytest.fixture(scope="session")
def inferq_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's private cache of converted GGUF checkpoints (pass as cache_dir)."""
    return tmp_path_factory.mktemp("inferq-cache")


@pytest.fixture(scope="session")
def smollm2_dir(inferq_cache_dir: Path) -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF converted to a checkpoint directory."""
    from engine.weights.default_model import default_gguf_path
    from engine.weights.gguf import convert_gguf

    return convert_gguf(default_gguf_path(), inferq_cache_dir)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Callable[[str], Path]:
    """kind -> directory of the tiny `kind` checkpoint (see checkpoints.ARCHITECTURES), built on first use."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            if kind not in ARCHITECTURES:
                raise ValueError(f"unknown tiny architecture {kind!r}; known: {ARCHITECTURES}")
            built[kind] = build_tiny_checkpoint(kind, tmp_path_factory.mktemp(f"tiny-{kind}"), smollm2_dir)
        return built[kind]

    return get


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_checkpoint: Callable[[str], Path]) -> Path:
    """The tiny untied Llama checkpoint, the default model of engine tests."""
    return tiny_checkpoint("llama")
