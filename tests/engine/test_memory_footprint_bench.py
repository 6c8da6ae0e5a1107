"""bench/memory_footprint.py: the arithmetic of sequences that fit, and a CPU dry run that builds the offline
benchmark's engine, serves its workload and the sampled requests, and reports the pool it really allocated."""

from __future__ import annotations

import json

from bench.memory_footprint import main, sequences_that_fit


def test_a_sequence_takes_whole_blocks() -> None:
    assert sequences_that_fit(pool_tokens=1024, block_size=64, length=64) == 16
    assert sequences_that_fit(pool_tokens=1024, block_size=64, length=65) == 8  # 2 blocks each
    assert sequences_that_fit(pool_tokens=1000, block_size=64, length=100) == 7  # 15 whole blocks, 2 a sequence
    assert sequences_that_fit(pool_tokens=1024, block_size=64, length=2048) == 0


def test_a_dry_run_reports_the_pool_it_served_from(tmp_path) -> None:
    result = main(["--dry-run", "--models", "Qwen3-0.6B", "--out", str(tmp_path)])
    (model,) = result["models"]
    assert model["kv_pool_tokens"] == 8192  # the dry run's engine asks for 8,192 KV tokens
    assert model["kv_pool_bytes"] > 0 and model["weights_bytes"] > 0
    block = model["block_size"]
    assert model["fits"]["2048"] == 8192 // block // (2048 // block)
    assert model["new_segments_while_serving"] is None  # no CUDA allocator on the CPU
    assert json.loads((tmp_path / "memory_footprint.json").read_text())["models"] == result["models"]
