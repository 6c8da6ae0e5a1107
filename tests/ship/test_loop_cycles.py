"""bench/loop_cycles.py: iterations grouped by the size of the step they read, means per iteration."""

from __future__ import annotations

from bench.loop_cycles import LoopCycles, cycles_markdown
from engine.step_timer import StepTiming


def _iteration(cycles: LoopCycles, records: list, num_seqs: int | None, step_s: float, blocked_s: float) -> None:
    cycles.begin()
    cycles.add("engine.step", step_s)
    if num_seqs is not None:  # the step timer finished the record of the step this iteration read
        records.append(StepTiming(0.0, blocked_s, 0.0, num_seqs, 1, True, 1, 0.0))
    cycles.add_step_records(records)
    cycles.add("_step", step_s + 0.001)
    cycles.add("_iteration", step_s + 0.002)
    cycles.end()


def test_iterations_group_by_the_step_read_and_average_their_phases() -> None:
    cycles, records = LoopCycles(edges=(2, 33, 257)), []  # records: the step timer's, as a run appends them
    _iteration(cycles, records, 200, 0.008, 0.003)
    _iteration(cycles, records, 256, 0.010, 0.001)
    _iteration(cycles, records, 16, 0.004, 0.002)
    _iteration(cycles, records, None, 0.004, 0.0)  # read no step: not a cycle
    cycles.begin()  # idle: no engine step
    cycles.add("_iteration", 0.05)
    cycles.end()
    rows = cycles.summary()
    assert [(r["seqs"], r["iterations"]) for r in rows] == [("2-32", 1), ("33-256", 2)]
    full = rows[1]["mean_ms"]
    assert abs(full["engine_host"] - 7.0) < 1e-9  # (8 - 3 + 10 - 1) / 2
    assert abs(full["after_step"] - 1.0) < 1e-9 and abs(full["before_step"] - 1.0) < 1e-9
    assert abs(full["_iteration"] - 11.0) < 1e-9
    text = "\n".join(cycles_markdown(rows))
    assert "| 33-256 | 2 | 11.00 |" in text
