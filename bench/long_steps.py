"""Placing the long steps of a batch-1 decode run (bench/decode_latency.py): steps whose wall time is over twice
the run's median, on the device or the host, and whether the benchmark's thread had the CPU in them.

Why: the mean ms/token of some runs sits well above their median step (H100, 2026-11-26: 12-13 of 511 steps at
4-5 ms; 2026-11-27: 9 of 21 Llama-3.2-1B runs on two of six H100 machines, every tile alike; see
bench/results/HISTORY.md); a kernel change cannot be judged by the mean until that tail is placed.
"""

from __future__ import annotations

import gc
import os
import time

from bench.engine_common import median


def long_step_indices(walls_ms: list[float]) -> list[int]:
    """The steps of one run whose wall time is over twice the run's median (the rule of every figure here)."""
    if not walls_ms:
        return []
    bar = 2 * median(walls_ms)
    return [i for i, wall in enumerate(walls_ms) if wall > bar]


def long_steps(
    walls_ms: list[float],
    gpus_ms: list[float],
    hosts_ms: list[float] | None = None,
    waits_ms: list[float] | None = None,
) -> dict:
    """The long steps of one run (wall time between two tokens reaching the caller) and how many of them also took
    over twice the median GPU time: a long step on the device, where the others are the host's (the step's Python,
    the garbage collector, the OS) or device work outside the timed window. walls_ms[i] and gpus_ms[i] are one
    step's; GPU times of 0 (the CPU) leave every long step to the host. Where the step timer's host and wait times
    are given (StepTiming.host_s, wait_s), the long steps' means of each: a long host time is the host's own work,
    a long wait with a usual GPU time is device work outside the timed window (the step's staging kernel, which
    reads pinned host memory) or a device left idle."""
    if len(walls_ms) != len(gpus_ms):
        raise ValueError(f"one GPU time a step: {len(walls_ms)} wall times, {len(gpus_ms)} GPU times")
    if not walls_ms:
        return {"steps": 0, "long": 0, "long_on_gpu": 0, "wall_ms_max": 0.0, "gpu_ms_max": 0.0}
    gpu_bar = 2 * median(gpus_ms)
    long = long_step_indices(walls_ms)
    split = {
        "steps": len(walls_ms),
        "long": len(long),
        "long_on_gpu": sum(gpus_ms[i] > gpu_bar > 0 for i in long),
        "wall_ms_max": max(walls_ms),
        "gpu_ms_max": max(gpus_ms),
    }
    for key, times in (("host_ms_long", hosts_ms), ("wait_ms_long", waits_ms)):
        if times is not None:
            if len(times) != len(walls_ms):
                raise ValueError(f"one {key[:4]} time a step: {len(walls_ms)} wall times, {len(times)} {key[:4]} times")
            split[key] = sum(times[i] for i in long) / len(long) if long else 0.0
    return split


def long_steps_cpu(walls_ms: list[float], cpus_ms: list[float]) -> dict:
    """The long steps of one run: their wall time, and the CPU time the benchmark's thread had in them
    (time.thread_time), against the share of its wall time a median step had on the CPU. walls_ms[i] and
    cpus_ms[i] are one step's.

    Why: the thread runs the engine's host work and then spins in the CUDA event's synchronize until the device is
    done, so a step's CPU time is near its wall time; a long step with little CPU time is one where the OS had the
    thread off the CPU (preempted, or the virtual machine's CPU stolen), and one at the usual share was spent on
    the CPU, at work or spinning (2026-11-27: 100% in every long step measured)."""
    if len(walls_ms) != len(cpus_ms):
        raise ValueError(f"one CPU time a step: {len(walls_ms)} wall times, {len(cpus_ms)} CPU times")
    if not walls_ms:
        return {"long": 0, "wall_ms": 0.0, "cpu_ms": 0.0, "median_step_cpu_share": 0.0}
    long = long_step_indices(walls_ms)
    shares = [cpu / wall for cpu, wall in zip(cpus_ms, walls_ms) if wall > 0]
    return {
        "long": len(long),
        "wall_ms": sum(walls_ms[i] for i in long),
        "cpu_ms": sum(cpus_ms[i] for i in long),
        "median_step_cpu_share": median(shares) if shares else 0.0,
    }


class GcPasses:
    """The garbage collector's passes while it is entered: (start, end, generation), perf_counter seconds.

    Why: the engine's per-step Python allocates, so the collector runs every few steps (the first generation)
    and now and then over older ones; the benchmark freezes the start-up objects (engine_common), but a pass over
    the second generation still walks whatever survived since. A long step with a pass inside it is the
    collector's, or partly so."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, float, int]] = []
        self._started: float | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.passes.append((self._started, time.perf_counter(), info["generation"]))
            self._started = None

    def __enter__(self) -> GcPasses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on_gc)


def steal_ms() -> float | None:
    """The CPU time this virtual machine's hypervisor gave to others so far, summed over its CPUs (/proc/stat's
    steal column), in ms; None where there is no /proc/stat.

    Why: a guest counts a descheduled vCPU's time as its thread's own CPU time (the thread was "running"), so
    long_steps_cpu cannot tell a step the hypervisor stole from one spent at work; the steal column can, to the
    kernel's tick (10 ms)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    return int(fields[8]) * 1e3 / os.sysconf("SC_CLK_TCK")


def long_steps_gc(ends: list[float], passes: list[tuple[float, float, int]]) -> dict:
    """The long steps of one run (the wall time between tokens ends[i] and ends[i + 1], perf_counter seconds) that a
    garbage-collector pass overlapped, the collector's time inside them, and the run's passes by generation."""
    walls_ms = [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]
    long = long_step_indices(walls_ms)
    with_gc, gc_ms = 0, 0.0
    for i in long:
        begin, end = ends[i], ends[i + 1]
        inside = [min(b, end) - max(a, begin) for a, b, _ in passes if a < end and b > begin]
        with_gc += bool(inside)
        gc_ms += sum(inside) * 1e3
    by_generation = [sum(g == k for _, _, g in passes) for k in range(3)]
    longest = max(((b - a) * 1e3 for a, b, _ in passes), default=0.0)
    return {"long": len(long), "long_with_gc": with_gc, "gc_ms_in_long": gc_ms, "passes": by_generation,
            "pass_ms_max": longest}  # fmt: skip


def long_steps_markdown(results: dict, modes: tuple[tuple[str, str], ...]) -> list[str]:
    """A line for each run (of `modes`: (result key, label)) whose steps had a tail: how many steps took over twice
    the median, the thread's CPU time in them, and in the step timer's run whether their GPU time did too."""
    lines = []
    for name, r in results["models"].items():
        for mode, label in modes:
            m = r.get(mode)
            t = (m or {}).get("timer_run_long_steps")  # None in results written before 2026-11-26 22:00
            if not m or t is None or (m["steps_over_2x_median"] == 0 and t["long"] == 0):
                continue
            on_cpu, host_wait = _cpu_clause(m.get("long_steps_cpu")), _host_wait_clause(t, m)
            collector = _gc_clause(m.get("long_steps_gc")) + _steal_clause(m.get("steal_ms"))
            lines.append(f"- {name}, {label}: {m['steps_over_2x_median']} steps over twice the median step "
                         f"(longest {m['step_ms_max']:.2f} ms){on_cpu}{collector}; in the step timer's run "
                         f"{t['long']} of {t['steps']}, {t['long_on_gpu']} of them with over twice the median GPU time "
                         f"(longest GPU step {t['gpu_ms_max']:.2f} ms){host_wait}")  # fmt: skip
    if not lines:
        return []
    return ["", "Steps over twice the median step time (a long GPU time too: the device's; otherwise the host's; "
            "little CPU time for the benchmark's thread in them: the thread was off the CPU):",
            "", *lines]  # fmt: skip


def _cpu_clause(split: dict | None) -> str:
    """'; the benchmark thread's CPU time in them ...' of a long_steps_cpu split ('' without long steps, and in
    results written before 2026-11-27, which have none)."""
    if not split or not split["long"]:
        return ""
    share = split["cpu_ms"] / split["wall_ms"]
    return (f"; the benchmark thread's CPU time in them {split['cpu_ms']:.1f} of {split['wall_ms']:.1f} ms "
            f"({share:.0%}; a median step {split['median_step_cpu_share']:.0%})")  # fmt: skip


def _gc_clause(split: dict | None) -> str:
    """'; a garbage-collector pass in ...' of a long_steps_gc split ('' without long steps, and in results written
    before 2026-11-27 02:00, which have none)."""
    if not split or not split["long"]:
        return ""
    return (f"; a garbage-collector pass in {split['long_with_gc']} of them ({split['gc_ms_in_long']:.1f} ms of "
            f"collection; the run's passes by generation {'/'.join(map(str, split['passes']))}, longest "
            f"{split['pass_ms_max']:.2f} ms)")  # fmt: skip


def _steal_clause(stolen: float | None) -> str:
    """'; CPU time stolen by the hypervisor over the run ...' ('' where not measured: results written before
    2026-11-27 02:00, or no /proc/stat)."""
    return "" if stolen is None else f"; CPU time stolen by the hypervisor over the run {stolen:.0f} ms (all CPUs)"


def _host_wait_clause(timer_split: dict, mode: dict) -> str:
    """', host / wait time ...' of the step timer's long steps against the mode's median step ('' without long
    steps, and in results written before 2026-11-27, which have no host / wait split)."""
    if not timer_split["long"] or "host_ms_long" not in timer_split:
        return ""
    return (f", host / wait time {timer_split['host_ms_long']:.2f} / {timer_split['wait_ms_long']:.2f} ms a long "
            f"step (a median step {mode['host_ms_median']:.2f} / {mode['wait_ms_median']:.2f})")  # fmt: skip
