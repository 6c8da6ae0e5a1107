"""bench/online_latency.py: its Poisson schedule, and a dry run of the whole benchmark against the real stack
on the CPU (a private redis-server, the worker with the tiny model, four API processes, open-loop streaming
clients): every request completes, and the figures are the streams' own."""

from __future__ import annotations

import json
import statistics

import pytest

from bench.online_latency import load_figures, main, poisson_arrivals, requests_of, with_model


def test_arrivals_are_a_poisson_process_of_the_rate() -> None:
    times = poisson_arrivals(50.0, 200.0, seed=1)
    # 10,000 expected, standard deviation 100
    assert abs(len(times) - 10_000) < 400
    assert times == sorted(times) and times[0] > 0 and times[-1] < 200.0
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert abs(statistics.mean(gaps) - 0.02) < 0.001
    assert abs(statistics.stdev(gaps) / statistics.mean(gaps) - 1.0) < 0.05  # exponential gaps: CV 1
    assert poisson_arrivals(50.0, 200.0, seed=1) == times and poisson_arrivals(50.0, 200.0, seed=2) != times


def test_request_lengths_stay_in_their_ranges() -> None:
    pairs = requests_of(500, 1000, (100, 300), (90, 270), seed=4)
    assert {len(p) for p, _ in pairs} <= set(range(100, 301)) and {n for _, n in pairs} <= set(range(90, 271))
    assert abs(statistics.mean(len(p) for p, _ in pairs) - 200) < 10
    assert all(0 <= t < 1000 for p, _ in pairs for t in p)


def test_figures_count_an_error_and_time_the_streams() -> None:
    ok = {"due": 10.0, "sent": 10.001, "chunks": [10.051, 10.061, 10.081], "end": 10.09, "completion_tokens": 3,
          "error": None}  # fmt: skip
    failed = {"due": 10.5, "sent": 10.5, "chunks": [], "end": 10.6, "completion_tokens": None, "error": "HTTP 503"}
    figures = load_figures([ok, failed], start_at=10.0, offered_rate=2.0)
    assert figures["requests"] == 2 and figures["errors"] == 1 and figures["error_examples"] == ["HTTP 503"]
    assert figures["ttft_ms"]["p50"] == pytest.approx(50.0)
    assert figures["itl_ms"]["p50"] == pytest.approx(15.0) and figures["itl_ms"]["p99"] == pytest.approx(19.9)
    assert figures["send_lag_ms"]["max"] == pytest.approx(1.0)


@pytest.mark.timeout(300)
def test_a_dry_run_serves_every_request_of_both_loads(tmp_path) -> None:
    result = main(["--dry-run", "--out", str(tmp_path)])
    run = result["models"]["Qwen3-0.6B"]
    assert run["capacity"]["errors"] == 0 and run["capacity"]["completed_req_s"] > 0
    assert [load["fraction_of_capacity"] for load in run["loads"]] == [0.5, 0.9]
    for load in run["loads"]:
        assert load["requests"] > 0 and load["errors"] == 0, load["error_examples"]
        assert 0 < load["ttft_ms"]["p50"] <= load["ttft_ms"]["p99"]
        assert 0 < load["itl_ms"]["p50"] <= load["itl_ms"]["p99"]
    saved = json.loads((tmp_path / "online_latency.json").read_text())
    assert saved["models"]["Qwen3-0.6B"]["loads"] == run["loads"]
    assert "| 90% |" in (tmp_path / "online_latency.md").read_text()


def test_a_model_run_adds_its_entry_and_replaces_its_own() -> None:
    meta = {"date": "2026-11-27T08:40:00+00:00", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6"}
    first = with_model(None, "Qwen3-0.6B", {"loads": [1]}, meta)
    both = with_model(first, "Llama-3.1-8B", {"loads": [2]}, {**meta, "date": "2026-11-27T08:50:00+00:00"})
    assert list(both["models"]) == ["Qwen3-0.6B", "Llama-3.1-8B"]
    assert both["models"]["Qwen3-0.6B"] == {"date": "2026-11-27T08:40:00+00:00", "loads": [1]}
    again = with_model(both, "Qwen3-0.6B", {"loads": [3]}, {**meta, "date": "2026-11-28T00:00:00+00:00"})
    assert list(again["models"]) == ["Qwen3-0.6B", "Llama-3.1-8B"] and again["models"]["Llama-3.1-8B"]["loads"] == [2]
    assert again["models"]["Qwen3-0.6B"] == {"date": "2026-11-28T00:00:00+00:00", "loads": [3]}
    assert first["models"] == {"Qwen3-0.6B": {"date": meta["date"], "loads": [1]}}  # the previous file untouched
