"""bench/step_periods.py: a run's steps grouped by batch size, each group's loop period against its GPU time."""

from __future__ import annotations

import pytest

from bench.step_periods import period_by_batch, period_markdown
from engine.step_timer import StepTiming


def _step(start_ms: float, gpu_ms: float, num_seqs: int, host_ms: float = 0.1) -> StepTiming:
    return StepTiming(host_ms / 1e3, 0.0, gpu_ms, num_seqs, num_seqs, True, 100 * num_seqs, start_ms / 1e3)


def test_a_period_longer_than_the_gpu_time_counts_its_excess_in_its_batch_group() -> None:
    steps = [
        _step(0.0, 5.0, 256),  # period 6: 1 ms over its GPU time
        _step(6.0, 5.0, 256),  # period 5: the device was the bottleneck
        _step(11.0, 2.0, 40),  # period 3: 1 ms over
        _step(14.0, 1.0, 1),  # the last step: no period, left out
    ]
    groups = {g["seqs"]: g for g in period_by_batch(steps)}
    assert set(groups) == {"193-256", "33-64"}  # empty groups are left out
    full = groups["193-256"]
    assert full["steps"] == 2 and full["period_ms"] == pytest.approx(11.0) and full["gpu_ms"] == pytest.approx(10.0)
    assert full["period_over_gpu_ms"] == pytest.approx(1.0) and full["host_ms"] == pytest.approx(0.2)
    assert groups["33-64"]["period_over_gpu_ms"] == pytest.approx(1.0)
    assert period_by_batch(steps[:1]) == []


def test_the_table_gives_each_group_in_seconds() -> None:
    lines = period_markdown("Offline engine", period_by_batch([_step(0.0, 5.0, 256), _step(6.0, 5.0, 256)]))
    assert lines[0].startswith("Offline engine: steps by batch size")
    assert lines[-1] == "| 193-256 | 1 | 0.006 | 0.005 | 0.000 | 0.001 |"
