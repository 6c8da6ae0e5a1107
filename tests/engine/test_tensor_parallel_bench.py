"""bench/tensor_parallel.py's CPU dry run (gloo, tiny shape): both sizes measured on engines of 1 and 2 ranks, the
all-reduce timed for 2 ranks before them, ratios and the all-reduce share of a decode step derived; a size larger
than the GPUs is skipped with a note."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.all_reduce_cost import decode_step_share
from bench.tensor_parallel import _usable_sizes
from bench.tensor_parallel_report import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_measures_both_sizes_and_the_all_reduce_of_two_ranks(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.tensor_parallel", "--dry-run", "--sizes", "1,2", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "tensor_parallel.json").read_text())
    assert results["sizes"] == [1, 2] and results["skipped_sizes"] == {}
    sizes = results["models"]["Llama-3.1-8B"]["sizes"]
    assert set(sizes) == {"1", "2"}
    for row in sizes.values():
        assert "error" not in row, row
        assert row["decode"]["ms_per_token"] > 0 and row["decode"]["floor_ms_per_token"] > 0
        assert row["offline"]["output_tok_s"] > 0 and row["offline"]["preemptions"] == 0
        assert row["kv_pool_blocks"] > 0
    # rank 0 of 2 holds half the projections and K/V heads, and the whole LM head
    one, two = sizes["1"], sizes["2"]
    assert two["costs"]["kv_bytes_per_token"] * 2 == one["costs"]["kv_bytes_per_token"]
    assert two["costs"]["lm_head_params"] == one["costs"]["lm_head_params"]
    assert one["rank0_streamed_weight_bytes"] > two["rank0_streamed_weight_bytes"]
    assert two["ratio_to_size_1"] == two["decode"]["ms_per_token"] / one["decode"]["ms_per_token"]
    reduce = results["all_reduce"]["2"]
    assert reduce["backend"] == "gloo" and "1" not in results["all_reduce"]
    assert [(m["rows"], m["hidden"]) for m in reduce["messages"]] == [(1, 64), (64, 64)]
    assert all(m["us_eager"] > 0 for m in reduce["messages"]) and reduce["bus"]["busbw_gbps"] > 0
    share = two["all_reduce_per_step"]
    assert share["all_reduces"] == 2 * 2 + 1  # the tiny shape's 2 layers, and the embedding's
    assert share["share_of_ms_per_token"] > 0
    text = (tmp_path / "tensor_parallel.md").read_text()
    assert "| Llama-3.1-8B | 2 |" in text and "x TP 1 <= 0.62" in text and "| 2 | [1, 64] | 128 |" in text


def test_a_size_beyond_the_gpus_is_skipped_with_a_note() -> None:
    sizes, skipped = _usable_sizes([1, 2, 4], dry_run=False)  # this machine sees no GPU
    assert sizes == [] and skipped["4"] == "needs 4 GPUs; this process sees 0"
    assert _usable_sizes([1, 2, 4], dry_run=True) == ([1, 2, 4], {})
    results = {"meta": {"date": "d", "gpu": "g", "torch": "t", "triton": "tr", "transformers": "tf", "python": "p",
                        "gpus": 2, "nccl_nvls_enable": "0"},
               "ceilings": {"read_gbps": 4000.0, "matmul_tflops": 800.0}, "sizes": [1, 2],
               "skipped_sizes": {"4": "needs 4 GPUs; this process sees 2"}, "all_reduce": {}, "models": {}}  # fmt: skip
    assert "- Size 4 skipped: needs 4 GPUs; this process sees 2." in markdown(results)


def test_a_decode_steps_all_reduces_come_from_the_graph_figure_of_one_row() -> None:
    result = {"messages": [{"rows": 1, "hidden": 4096, "us_eager": 20.0, "us_graph": 8.0},
                           {"rows": 64, "hidden": 4096, "us_eager": 30.0, "us_graph": 12.0}]}  # fmt: skip
    share = decode_step_share(result, 4096, 32, ms_per_token=4.0)
    assert share["all_reduces"] == 65 and share["ms_per_step"] == pytest.approx(65 * 8.0 / 1e3)
    assert share["share_of_ms_per_token"] == pytest.approx(0.13)
    assert decode_step_share(result, 8192, 80, 4.0) is None
