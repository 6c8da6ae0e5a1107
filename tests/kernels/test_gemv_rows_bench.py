"""bench/gemv_rows.py's code paths on the CPU (a dry run: the tiny shapes at three rows) and its arithmetic: the
projection shapes, the weight-read floor, the best tile among those swept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gemv_rows


def test_projection_shapes():
    shapes = {
        (p.model, p.name): (p.num_out, p.num_in, p.normed, p.swiglu) for m in gemv_rows.SHAPES.values() for p in m
    }
    assert shapes[("SmolLM2-135M", "qkv")] == (960, 576, True, False)
    assert shapes[("SmolLM2-135M", "gate_up")] == (3072, 576, True, True)
    assert shapes[("SmolLM2-135M", "down")] == (576, 1536, False, False)
    assert shapes[("Llama-3.1-8B", "gate_up")] == (28672, 4096, True, False)  # SwiGLU apart above 2048 (engine.ops)


def test_dry_run_writes_rows_with_floors(tmp_path: Path):
    results = gemv_rows.main(["--dry-run", "--out", str(tmp_path)])
    rows = results["rows"]
    assert len(rows) == 4 * len(gemv_rows.DRY_ROWS)
    for row in rows:
        assert row["floor_us"] == pytest.approx(row["N"] * row["K"] * 4 / results["ceilings"]["read_gbps"] / 1e3)
        assert row["best_us"] == min(row["tiles_us"].values()) and row["kernel_us"] == row["tiles_us"]["default"]
    saved = json.loads((tmp_path / "gemv_rows.json").read_text())
    assert len(saved["rows"]) == len(rows)
    assert "| tiny | gate_up | 512 x 128 | 3 |" in (tmp_path / "gemv_rows.md").read_text()
