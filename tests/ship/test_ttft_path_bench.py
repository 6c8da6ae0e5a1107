"""bench/ttft_path.py's dry run on the CPU: a real API, Redis and worker, one request at a time; every request is
marked at each stage of its path, in order, and the gaps add up to its time to first token."""

from __future__ import annotations

import json

import pytest

from bench.ttft_path import MARKS, main


@pytest.mark.timeout(300)
def test_a_dry_run_marks_every_request_in_order(tmp_path) -> None:
    result = main(["--dry-run", "--requests", "4", "--out", str(tmp_path)])
    requests = result["requests"]
    assert len(requests) == 4
    order = [name for name, _ in MARKS]
    for at in requests:
        present = [name for name in order if name in at]
        # the CPU engine is synchronous: its prefill step reads the token (no separate token step)
        assert present == [n for n in order if n not in ("token_start", "token_end")], present
        times = [at[name] for name in present]
        assert times == sorted(times) and times[0] > 0 and at["headers"] > 0
    summary = result["summary"]
    assert summary["service_ttft_p50_ms"] > summary["engine_ttft_p50_ms"] > 0
    assert {g["mark"] for g in summary["gaps"] if g["count"] == 4} == set(present)
    assert json.loads((tmp_path / "ttft_path.json").read_text())["summary"] == summary
    assert "API intake (send to the worker's read)" in (tmp_path / "ttft_path.md").read_text()
