"""bench/quant_gemm.py's code paths on the CPU (a dry run of two formats at one and three tokens) and its
arithmetic: the Llama projection shapes, the bytes a weight streams, the floor and its share; bench/quant_tiles.py's
dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import quant_gemm, quant_tiles


def test_llama_projection_shapes():
    shapes = {(p.model, p.name): (p.num_out, p.num_in) for m in quant_gemm.SHAPES.values() for p in m}
    assert shapes[("Llama-3.1-8B", "qkv")] == (6144, 4096)
    assert shapes[("Llama-3.1-8B", "down")] == (4096, 14336)
    assert shapes[("Llama-3.2-1B", "qkv")] == (3072, 2048)
    assert shapes[("Llama-3.2-1B", "gate_up")] == (16384, 2048)


def test_dry_run_writes_rows_with_floors(tmp_path: Path):
    results = quant_gemm.main(["--dry-run", "--out", str(tmp_path), "--tokens", "1,3", "--formats", "bf16,int4"])
    rows = results["rows"]
    assert len(rows) == 4 * 2 * 2  # projections x formats x token counts
    ceilings = results["ceilings"]
    for row in rows:
        nbytes = row["weight_bytes"] + row["tokens"] * (row["K"] + row["N"]) * 4  # fp32 x and y on the CPU
        floor_us = (
            max(
                nbytes / ceilings["read_gbps"],
                2 * row["tokens"] * row["N"] * row["K"] / ceilings["matmul_tflops"] / 1e3,
            )
            / 1e3
        )
        assert row["floor_us"] == pytest.approx(floor_us)
        assert row["frac_of_floor"] == pytest.approx(row["floor_us"] / row["us"])
    int4 = next(r for r in rows if r["format"] == "int4")
    # codes at half a byte, fp32 scales and uint8 zero points a group of 128
    assert int4["weight_bytes"] == int4["N"] * int4["K"] // 2 + int4["N"] * int4["K"] // 128 * 5
    assert all("torch_us" in r for r in rows if r["format"] == "bf16")
    saved = json.loads((tmp_path / "quant_gemm.json").read_text())
    assert len(saved["rows"]) == len(rows)
    assert "## Every layer's projections at one token" in (tmp_path / "quant_gemm.md").read_text()


def test_tile_alternatives_dry_run(tmp_path: Path):
    results = quant_tiles.main(["--dry-run", "--out", str(tmp_path), "--tokens", "1", "--formats", "int4"])
    rows = results["rows"]
    assert rows[0]["tile"]["BLOCK_N"] == 4 and len(rows) == len({str(r["tile"]) for r in rows}) > 4
    assert all("us" in r for r in rows), [r.get("error") for r in rows]
    assert "| tiny qkv int4 M=1 |" in (tmp_path / "quant_tiles.md").read_text()
