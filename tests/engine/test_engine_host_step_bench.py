"""bench/engine_host_step.py: the engine's own Python per full decode step, piece by piece, on the CPU."""

from __future__ import annotations

import json

import pytest

from bench.engine_host_step import PIECES, build, main


def test_a_small_run_times_every_piece_of_full_decode_steps(tmp_path) -> None:
    result = main(["--requests", "16", "--steps", "4", "--repeats", "2", "--out", str(tmp_path)])
    ms = json.loads((tmp_path / "engine_host_step.json").read_text())["ms_per_step"]
    assert ms == pytest.approx(result["ms_per_step"])
    for key, _ in PIECES:
        assert ms[key] > 0, key
    # the pieces lie inside the step: what is left of it is the step's own loops, not a negative remainder
    assert ms["prepare"] < ms["launch"] < ms["host"]
    assert ms["schedule"] + ms["launch"] + ms["collect"] + ms["process"] + ms["record"] < ms["host"]
    text = (tmp_path / "engine_host_step.md").read_text()
    assert all(label in text for _, label in PIECES)


def test_the_stand_in_forward_serves_plain_greedy_decode_steps_only() -> None:
    """Anything else would not be the step the benchmark says it times."""
    engine, totals = build(4)
    engine.step()
    assert totals["forward"] > 0 and len(engine.last_step.scheduled) == 4
    with pytest.raises(RuntimeError, match="plain greedy decode steps only"):
        engine.runner.graphs.run((4, 4), greedy=False)
