"""The model runner's warm-up forward (run on CUDA before the KV pool is sized), here on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.engine_helpers import make_engine
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint_factory(request, tmp_path_factory)("llama")


@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_warm_up_pool_has_a_block_for_each_sequence(model_dir: Path, block_size: int) -> None:
    """At the largest step (64 tokens over 8 sequences of 8) every sequence starts a block of its own:
    a scratch pool sized by tokens alone (64 / 64 + 1 = 2 blocks) is indexed past its end, which on
    the GPU was an illegal memory access at engine start with 64-token blocks (2026-11-25)."""
    engine = make_engine(model_dir, block_size=block_size, max_num_batched_tokens=64, max_num_seqs=8,
                         num_kv_tokens=1024)  # fmt: skip
    engine.runner._warm_up(64, 8)  # raises IndexError on CPU when the pool is too small
