"""The benchmarks on MoE models: the roofline counts the experts a step touches and the active parameters
(published figures pin the counts), the engine benchmarks accept MoE configs, and the MoE layer benchmark
and the tuning script run their code paths on the CPU (dry runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.roofline import ModelCosts
from engine.config import ModelConfig
from engine.model_loader import load_model

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
ON_GPU = torch.cuda.is_available()
# activated parameters as published (model cards): Qwen3-30B-A3B 3.3B, Qwen1.5-MoE-A2.7B 2.7B, Mixtral 12.9B
ACTIVE_BILLIONS = {"Qwen3-30B-A3B": 3.3, "Qwen1.5-MoE-A2.7B": 2.7, "Mixtral-8x7B": 12.9}


def costs_of(name: str) -> ModelCosts:
    loaded = load_model(ModelConfig(model=str(CONFIGS / name), load_format="dummy"), torch.device("meta"),
                        torch.bfloat16)  # fmt: skip
    return ModelCosts.from_model(loaded.model, loaded.hf_config)


@pytest.mark.parametrize("name", sorted(ACTIVE_BILLIONS))
def test_moe_costs_count_the_published_active_parameters(name: str) -> None:
    costs = costs_of(name)
    total = costs.all_param_bytes // 2
    active = total - costs.expert_params * (1 - costs.top_k / costs.num_experts)
    assert abs(active / 1e9 - ACTIVE_BILLIONS[name]) < 0.06  # Qwen3's 3.35B is published as 3.3B
    # a one-token step streams the dense weights and K of E experts; a large step all of them
    dense = costs.weight_bytes - costs.expert_bytes
    assert costs.step_weight_bytes(1) == pytest.approx(dense + costs.expert_bytes * costs.top_k / costs.num_experts)
    assert costs.step_weight_bytes(4096) == pytest.approx(costs.weight_bytes)


def test_qwen3_moe_expert_bytes_are_every_layers_packed_experts() -> None:
    costs = costs_of("Qwen3-30B-A3B")
    assert (costs.num_experts, costs.top_k) == (128, 8)
    assert costs.expert_bytes == 48 * 128 * 3 * 2048 * 768 * 2


def test_dense_costs_keep_their_formula() -> None:
    costs = costs_of("Llama-3.2-1B")
    assert costs.expert_bytes == costs.num_experts == 0
    assert costs.step_weight_bytes(7) == costs.weight_bytes
    assert costs.active_projection_params() == costs.projection_params


def test_engine_benchmarks_dry_run_an_moe_config(tmp_path: Path) -> None:
    from bench import decode_latency, offline_throughput

    args = ["--dry-run", "--skip-hf", "--models", "Qwen1.5-MoE-A2.7B", "--out", str(tmp_path)]
    for bench in (decode_latency, offline_throughput):
        row = bench.main(args)["models"]["Qwen1.5-MoE-A2.7B"]
        assert "error" not in row, row
        assert (row["costs"]["num_experts"], row["costs"]["top_k"]) == (60, 4)
    assert (tmp_path / "decode_latency.md").is_file() and (tmp_path / "offline_throughput.md").is_file()


@pytest.mark.skipif(ON_GPU, reason="a CPU dry run (the Triton interpreter); on a GPU bench/run_gpu_moe.sh runs it")
def test_moe_layer_benchmark_dry_run(tmp_path: Path) -> None:
    from bench import moe_layer

    results = moe_layer.main(["--dry-run", "--out", str(tmp_path)])
    assert {r["path"] for r in results["layer"]} == {"gemv", "grouped"}
    assert all(r["us"] > 0 and r["floor_us"] > 0 and "torch_us" in r for r in results["layer"])
    assert len(results["router"]) == 2 * len(moe_layer.DRY_TOKENS)
    assert [(r["experts"], r["hidden"]) for r in results["gate"]] == [(5, 64), (9, 48)]
    assert all(r["gemv_us"] > 0 and r["cublas_us"] > 0 for r in results["gate"])
    assert "| tiny | 40 | grouped |" in (tmp_path / "moe_layer.md").read_text()


@pytest.mark.skipif(ON_GPU, reason="a CPU dry run (the Triton interpreter); on a GPU bench/run_gpu_moe.sh runs it")
def test_tuning_dry_run_writes_an_entry_the_tile_chooser_reads(tmp_path: Path) -> None:
    from bench import moe_tune
    from kernels.moe_tiles import choose_tiles

    done = moe_tune.main(["--dry-run", "--config-dir", str(tmp_path)])
    (key,) = done
    table = json.loads((tmp_path / "cpu-interpreter.json").read_text())
    assert table[key] == done[key] and table["_runs"][key]["gpu"] == "cpu-interpreter"
    assert set(table[key]["grouped"]) == {"1", "3"}
    assert choose_tiles(table[key], 2, 5, 2)["BLOCK_M"] == 16
    # the one-token kernels' tiles: the fastest of each kernel's sweep, and what the chooser hands the kernels
    for kernel in ("gate_up", "down"):
        swept = table[key]["gemv_us"][kernel]
        assert len(swept) == 2 and json.loads(min(swept, key=swept.get)) == table[key]["gemv"][kernel]
        assert choose_tiles(table[key], 1, 5, 2)[f"gemv_{kernel}"] == table[key]["gemv"][kernel]


def test_concurrent_requests_benchmark_dry_run(tmp_path: Path) -> None:
    from bench import concurrent_decode

    row = concurrent_decode.main(["--dry-run", "--out", str(tmp_path)])["models"]["Llama-3.2-1B"]
    assert "error" not in row, row
    assert row["requests"] == concurrent_decode.DRY["requests"] and row["kv_pool_tokens"] > 0
    assert 0 < row["tpot_ms_median"] <= row["tpot_ms_max"] and row["floor_ms_per_token"] > 0
    assert "| Llama-3.2-1B | 3 | 40 | 12 |" in (tmp_path / "concurrent_decode.md").read_text()


def test_tuning_rules() -> None:
    from bench.moe_tune import coarse_tiles, fits, small_batch_max_tokens

    assert small_batch_max_tokens({1: 5.0, 2: 6.0, 4: 9.0, 8: 7.0}, {1: 8.0, 2: 7.0, 4: 8.0, 8: 9.0}) == 2
    assert small_batch_max_tokens({1: 9.0}, {1: 8.0}) == 0
    assert not fits({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 4})
    heights = {t["BLOCK_M"] for t in coarse_tiles(1, 128, 8)}
    assert heights == {16}  # one token: no taller row tile
    assert {t["BLOCK_M"] for t in coarse_tiles(8192, 128, 8)} == {16, 32, 64, 128}
