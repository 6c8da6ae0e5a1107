"""bench/service_overhead.py's dry run on the CPU: the offline engine, then the whole service (a private
redis-server, the worker with the tiny shape, the API, streaming clients) over the same workload; every path
reports its figures, and both report their steps by batch size and their first steps (bench/step_periods.py)."""

from __future__ import annotations

import json

import pytest

from bench.service_overhead import main


@pytest.mark.timeout(300)
def test_a_dry_run_serves_the_workload_and_reports_both_paths_steps(tmp_path) -> None:
    result = main(["--dry-run", "--out", str(tmp_path)])
    assert result["offline"]["output_tok_s"] > 0 and result["service"]["output_tok_s"] > 0
    offline_steps = sum(g["steps"] for g in result["offline"]["period_by_batch"])
    service_steps = sum(g["steps"] for g in result["service"]["worker_phases"]["period_by_batch"])
    assert offline_steps > 0 and service_steps > 0
    assert json.loads((tmp_path / "service_overhead.json").read_text())["offline"] == result["offline"]
    text = (tmp_path / "service_overhead.md").read_text()
    assert "Offline engine: steps by batch size" in text and "Service worker: steps by batch size" in text
    phases = result["service"]["worker_phases"]["phases_s"]  # the after-step split: building and handing over
    assert phases["events_for_outputs"] > 0 and phases["publisher.submit"] > 0
    assert 0 < phases["step_reads.receive"] <= phases["_finish_step_reads"]  # the replies' wait, inside
    assert "reading the replies off the socket" in text
    # Redis's clock on the step reads: every send answered, on the host's clock, before the receive returned
    clock = result["service"]["worker_phases"]["step_reads_clock"]
    assert clock["sends"] > 0 and 0 <= clock["answered_late_share"] <= 1
    assert -5 < clock["answered_after_send_ms"]["p50"] < clock["answered_after_send_ms"]["max"] + 1e-9
    assert 0 <= clock["receive_ms"]["p50"] <= clock["receive_ms"]["max"]
    assert 0 < len(clock["longest_receives"]) <= 5 and "Redis's TIME appended" in text
    assert phases["_send_reads_for_step"] > 0  # the reads go out after the step before theirs
    # Redis's own record of what kept it busy, with the thresholds the server held during the run
    stalls = result["service"]["redis_stalls"]
    assert stalls["slowlog_us"] == 2000 and stalls["latency_monitor_ms"] == 5
    assert sum(stalls["slow_commands"].values()) >= len(stalls["slowest"])
    assert all(e["ms"] >= 2 and e["command"] for e in stalls["slowest"])
    assert "Redis over the throughput run" in text
    assert "handing batches to the publisher" in text
    # the default load generator, and both paths' first steps one by one
    assert result["service"]["client"] == "socket" and "socket clients" in text
    offline_first = result["offline"]["first_steps"]
    service_first = result["service"]["worker_phases"]["first_steps"]
    assert 0 < len(offline_first) <= 8 and 0 < len(service_first) <= 8
    assert all(row["seqs"] > 0 and row["tokens"] >= row["seqs"] for row in offline_first + service_first)
    assert "Service worker: the first" in text and "Triton kernel variants looked up" in text
    # the burst's intake: every request of the throughput run went through Redis into the worker, in that order
    timeline = result["service"]["timeline_s"]
    assert len(result["service"]["worker_phases"]["intake"]) == result["workload"]["num_seqs"]
    assert -0.002 <= timeline["half_in_redis"] <= timeline["all_in_redis"] <= timeline["all_admitted"] + 0.002
    assert timeline["half_in_redis"] <= timeline["half_admitted"] + 0.002 <= timeline["last_step"] + 0.002
    assert "The burst's intake" in text
    # one loop iteration by batch size: every iteration that read a step counted once, its parts inside it
    cycles = result["service"]["worker_phases"]["loop_cycles"]
    assert 0 < sum(row["iterations"] for row in cycles) <= service_steps + 1
    for row in cycles:
        ms = row["mean_ms"]
        assert 0 < ms["engine_host"] + ms["blocked"] <= ms["_iteration"]
        assert ms["step_reads.receive"] <= ms["_finish_step_reads"] <= ms["after_step"]
    assert "Service worker: one loop iteration by batch size" in text
    offline_cycles = result["offline"]["loop_cycles"]
    assert 0 < sum(row["iterations"] for row in offline_cycles) <= offline_steps + 1
    assert all(0 < row["mean_ms"]["engine_host"] <= row["mean_ms"]["_iteration"] for row in offline_cycles)
    assert "Offline engine: one loop iteration by batch size" in text
