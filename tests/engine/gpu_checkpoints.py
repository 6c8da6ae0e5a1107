"""Tiny checkpoints for the GPU tests, which run where the packaged SmolLM2 GGUF (and the
gguf package that converts it) may be missing: the GPU machine gets the tokenizer files
carried in a folder instead (`python -m bench.engine_assets` writes it locally).

The folder is INFERQ_TOKENIZER_DIR when set, else artifacts/smollm2-tokenizer when it exists,
else the GGUF conversion of tests/engine/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine.checkpoints import ARCHITECTURES, build_tiny_checkpoint

CARRIED_TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "artifacts" / "smollm2-tokenizer"


def tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    """A directory holding the SmolLM2 tokenizer files."""
    configured = os.environ.get("INFERQ_TOKENIZER_DIR")
    if configured:
        return Path(configured)
    if (CARRIED_TOKENIZER_DIR / "tokenizer.json").is_file():
        return CARRIED_TOKENIZER_DIR
    return request.getfixturevalue("smollm2_dir")


def tiny_checkpoint_factory(request: pytest.FixtureRequest, tmp: pytest.TempPathFactory) -> Callable[[str], Path]:
    """kind -> the tiny `kind` checkpoint, built on first use with the tokenizer above."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in ARCHITECTURES:
            raise ValueError(f"unknown tiny architecture {kind!r}; known: {ARCHITECTURES}")
        if kind not in built:
            built[kind] = build_tiny_checkpoint(kind, tmp.mktemp(f"gpu-tiny-{kind}"), tokenizer_dir(request))
        return built[kind]

    return get
