"""bench/window_kv_memory.py: the KV a long Gemma 3 sequence holds in inferq's one pool (every block, as a
full-attention model of the same size) against a pool per layer kind, counted through the engine's BlockManager."""

from __future__ import annotations

import json

from bench.window_kv_memory import blocks_held, main


def test_the_block_manager_holds_every_block_of_a_long_sequence() -> None:
    assert blocks_held(32768, 64) == 512
    assert blocks_held(32769, 64) == 513
    assert blocks_held(100, 16) == 7


def test_gemma3_1b_at_32k_holds_what_full_attention_holds(tmp_path) -> None:
    result = main(["--models", "Gemma-3-1B", "--lengths", "32768,65536", "--out", str(tmp_path)])
    (row,) = result["rows"]  # 65,536 is past Gemma-3-1B's 32,768 positions: no row
    assert (row["layers"], row["sliding_layers"], row["window"], row["blocks"]) == (26, 22, 512, 512)
    layer_block_gib = 2 * 64 * 1 * 256 * 2 / 2**30  # K and V, 64 tokens, Hkv 1, D 256, bf16
    assert row["inferq_gib"] == row["full_attention_gib"] == 512 * 26 * layer_block_gib
    # 4 global layers keep 512 blocks, 22 sliding layers the 9 blocks that can hold the last 512 positions
    assert row["per_group_pool_gib"] == (4 * 512 + 22 * 9) * layer_block_gib
    assert json.loads((tmp_path / "window_kv_memory.json").read_text())["rows"] == result["rows"]
