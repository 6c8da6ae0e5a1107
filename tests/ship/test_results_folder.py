"""bench/report.py's results_folder: where a benchmark writes when no --out is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report import RESULTS, gpu_folder, results_folder


@pytest.mark.parametrize(("name", "folder"), [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla T4", "t4"),
    ("NVIDIA GeForce RTX 4090", "geforce_rtx_4090"),
    (None, "cpu"),
])  # fmt: skip
def test_a_gpu_kind_names_its_folder(name, folder) -> None:
    assert gpu_folder(name) == folder


def test_out_wins_then_the_environment_then_the_gpu_kind(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OUT", str(tmp_path / "env"))
    assert results_folder(str(tmp_path / "flag")) == tmp_path / "flag"
    assert results_folder(None) == tmp_path / "env"
    monkeypatch.delenv("OUT")
    assert results_folder(None, dry_run=True) == RESULTS / "tmp"  # a dry run's figures are never committed
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: no GPU
    assert results_folder(None) == RESULTS / "cpu"
    assert Path(__file__).resolve().parents[2] / "bench" / "results" == RESULTS
