"""The request-intake diagnostics run and report what their result files claim: bench/request_parse_costs.py
(every check timed, the same ids through the API's and the worker's paths) and bench/burst_arrival.py (a small
burst from each load generator reaches the real API's stream, every message counted)."""

from __future__ import annotations

import json

from bench.burst_arrival import main as burst_main
from bench.request_parse_costs import measure


def test_request_parse_costs_times_every_check() -> None:
    costs = measure(64)
    assert costs["ids"] == 64
    checks = [k for k in costs if k.endswith("_us")]
    assert len(checks) == 5 and all(costs[k] > 0 for k in checks)


def test_burst_arrival_counts_each_clients_burst_in_redis(tmp_path) -> None:
    result = burst_main(["--requests", "4", "--rounds", "1", "--out", str(tmp_path)])
    assert [r["client"] for r in result["rounds"]] == ["httpx", "socket"]
    for r in result["rounds"]:
        assert r["messages"] == 4
        assert r["first_ms"] <= r["median_ms"] <= r["last_ms"] < 30_000
    assert json.loads((tmp_path / "burst_arrival.json").read_text())["rounds"] == result["rounds"]
