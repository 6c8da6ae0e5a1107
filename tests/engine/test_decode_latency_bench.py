"""bench/long_steps.py and bench/decode_latency.py: placing a run's long steps on the device or the host (and,
on the host, whether the benchmark's thread had the CPU in them), and a CPU dry run that reports it for every mode
and writes it into the markdown when a run has any."""

from __future__ import annotations

import gc
import json

import pytest

from bench.decode_latency import main, markdown
from bench.long_steps import GcPasses, long_steps, long_steps_cpu, long_steps_gc, steal_ms


def test_long_steps_count_those_whose_gpu_time_was_long_too() -> None:
    walls = [1.0, 1.1, 1.0, 5.0, 1.0, 4.0, 1.0]
    gpus = [0.9, 0.9, 0.9, 0.9, 0.9, 3.5, 0.9]
    assert long_steps(walls, gpus) == {"steps": 7, "long": 2, "long_on_gpu": 1, "wall_ms_max": 5.0, "gpu_ms_max": 3.5}


def test_long_steps_give_the_mean_host_and_wait_time_of_the_long_steps() -> None:
    walls = [1.0, 1.1, 1.0, 5.0, 1.0, 4.0, 1.0]
    gpus = [0.9] * 7
    hosts = [0.2, 0.2, 0.2, 0.3, 0.2, 3.1, 0.2]
    waits = [0.8, 0.9, 0.8, 4.7, 0.8, 0.9, 0.8]
    split = long_steps(walls, gpus, hosts, waits)
    assert split["long"] == 2 and split["long_on_gpu"] == 0
    assert split["host_ms_long"] == pytest.approx(1.7) and split["wait_ms_long"] == pytest.approx(2.8)
    assert "host_ms_long" not in long_steps(walls, gpus)  # the main run has no step timer
    with pytest.raises(ValueError, match="one wait time a step"):
        long_steps(walls, gpus, hosts, waits[:-1])


def test_without_gpu_times_every_long_step_is_the_hosts() -> None:
    assert long_steps([1.0, 1.0, 9.0], [0.0, 0.0, 0.0])["long_on_gpu"] == 0
    assert long_steps([], [])["long"] == 0


def test_long_steps_need_one_gpu_time_a_step() -> None:
    with pytest.raises(ValueError, match="one GPU time a step"):
        long_steps([1.0, 2.0], [1.0])


def test_long_steps_cpu_sums_the_threads_cpu_time_in_the_long_steps_only() -> None:
    walls = [1.0, 1.0, 1.0, 4.0, 1.0, 3.0]
    cpus = [1.0, 0.9, 1.0, 0.5, 1.0, 2.9]
    split = long_steps_cpu(walls, cpus)  # shares 1, 0.9, 1, 0.125, 1, 29/30: the median (29/30 + 1) / 2
    assert split == {"long": 2, "wall_ms": 7.0, "cpu_ms": 3.4, "median_step_cpu_share": pytest.approx(59 / 60)}


def test_long_steps_cpu_needs_one_cpu_time_a_step() -> None:
    with pytest.raises(ValueError, match="one CPU time a step"):
        long_steps_cpu([1.0, 2.0], [1.0])
    assert long_steps_cpu([], [])["long"] == 0


def test_long_steps_gc_counts_the_long_steps_a_pass_overlapped_and_its_time_inside_them() -> None:
    ends = [0.0, 0.001, 0.002, 0.006, 0.007, 0.008, 0.011, 0.012]  # steps 2 (4 ms) and 5 (3 ms) are long
    passes = [(0.0035, 0.0045, 2), (0.0070, 0.0072, 0), (0.0105, 0.0115, 1)]  # in step 2, step 4, steps 5-6
    split = long_steps_gc(ends, passes)
    assert split["long"] == 2 and split["long_with_gc"] == 2
    assert split["gc_ms_in_long"] == pytest.approx(1.0 + 0.5)  # only the part of the third pass inside step 5
    assert split["passes"] == [1, 1, 1] and split["pass_ms_max"] == pytest.approx(1.0)
    assert long_steps_gc(ends, [passes[1]])["long_with_gc"] == 0  # a pass in a usual step is not counted


def test_gc_passes_records_a_collection_made_while_entered_only() -> None:
    with GcPasses() as collector:
        gc.collect(1)
    gc.collect(0)
    ((start, end, generation),) = collector.passes
    assert generation == 1 and end >= start


def test_steal_ms_reads_a_count_that_never_goes_back() -> None:
    first = steal_ms()
    assert first is not None and first >= 0  # Linux: /proc/stat has a steal column
    assert steal_ms() >= first


def test_a_dry_run_reports_its_long_steps_and_the_markdown_names_them(tmp_path) -> None:
    result = main(["--dry-run", "--skip-hf", "--models", "Llama-3.2-1B", "--out", str(tmp_path)])
    (model,) = result["models"].values()
    for mode in ("graphs_on", "graphs_sampling", "graphs_off"):
        split = model[mode]["timer_run_long_steps"]
        assert split["steps"] == model[mode]["timed_steps"]  # one wall time for each timed decode step
        assert 0 <= split["long_on_gpu"] <= split["long"] <= split["steps"]
        assert split["host_ms_long"] >= 0 and split["wait_ms_long"] >= 0
        on_cpu = model[mode]["long_steps_cpu"]
        assert on_cpu["long"] == model[mode]["steps_over_2x_median"]  # the same steps, from the same run
        assert 0 < on_cpu["median_step_cpu_share"] <= 1.05  # thread CPU time never far past the wall time
        collected = model[mode]["long_steps_gc"]
        assert collected["long"] == on_cpu["long"] and 0 <= collected["long_with_gc"] <= collected["long"]
        assert model[mode]["steal_ms"] >= 0
    assert json.loads((tmp_path / "decode_latency.json").read_text())["models"] == result["models"]
    model["graphs_on"].update(steps_over_2x_median=12, step_ms_max=4.69)
    model["graphs_on"]["timer_run_long_steps"].update(
        long=3, long_on_gpu=0, gpu_ms_max=1.01, host_ms_long=0.21, wait_ms_long=3.4
    )
    model["graphs_on"].update(host_ms_median=0.18, wait_ms_median=0.8)
    model["graphs_on"]["long_steps_cpu"].update(long=12, wall_ms=40.0, cpu_ms=10.0, median_step_cpu_share=0.99)
    model["graphs_on"]["long_steps_gc"].update(long=12, long_with_gc=2, gc_ms_in_long=1.5, passes=[40, 3, 1],
                                               pass_ms_max=0.9)  # fmt: skip
    model["graphs_on"]["steal_ms"] = 20.0
    text = markdown(result)
    assert "Llama-3.2-1B, inferq, CUDA graphs: 12 steps over twice the median step (longest 4.69 ms)" in text
    assert "CPU time in them 10.0 of 40.0 ms (25%; a median step 99%)" in text
    assert "a garbage-collector pass in 2 of them (1.5 ms of collection; the run's passes by generation 40/3/1" in text
    assert "stolen by the hypervisor over the run 20 ms (all CPUs)" in text
    assert "host / wait time 0.21 / 3.40 ms a long step (a median step 0.18 / 0.80)" in text
    assert "3 of 23, 0 of them with over twice the median GPU time (longest GPU step 1.01 ms)" in text
