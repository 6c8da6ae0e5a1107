"""Where a benchmarked engine's device waited for its host: the steps' records (engine/step_timer.py's
StepTiming) grouped by batch size, each group's loop period against its GPU time.

Why: the service benchmark's worker runs the offline engine's steps plus the service's own host work, and on
slower hosts the service falls to 85-92% of the offline engine (bench/results/HISTORY.md); the
loop's totals say the host is busy ~90% of the run but not at which batch sizes its work outruns the GPU's.
A step's period is the wall time from its start to the next step's start (with async scheduling the host
stages step k + 1 while the device runs step k, so a period over the step's GPU time is time the device
spent waiting for the host, give or take the two steps' overlap).
"""

from __future__ import annotations

# Batch-size groups (upper bounds, exclusive): the tail of a run, the middle, and the full batch.
BATCH_EDGES = (2, 33, 65, 129, 193, 257)


def period_by_batch(records: list, edges: tuple[int, ...] = BATCH_EDGES) -> list[dict]:
    """For each group of steps by num_seqs (below edges[0], then [edges[i - 1], edges[i])): how many steps, their
    summed period (ms), GPU time (ms), host launch time (ms) and the period over the GPU time (ms, steps whose
    period was the longer only). The last step has no period and is left out."""
    groups = []
    lower = 0
    for upper in edges:
        groups.append({"seqs": f"{lower}-{upper - 1}", "steps": 0, "period_ms": 0.0, "gpu_ms": 0.0, "host_ms": 0.0,
                       "period_over_gpu_ms": 0.0})  # fmt: skip
        lower = upper
    for step, after in zip(records, records[1:]):
        group = next((g for g, upper in zip(groups, edges) if step.num_seqs < upper), None)
        if group is None:
            continue
        period = (after.started_s - step.started_s) * 1e3
        group["steps"] += 1
        group["period_ms"] += period
        group["gpu_ms"] += step.gpu_ms
        group["host_ms"] += step.host_s * 1e3
        group["period_over_gpu_ms"] += max(0.0, period - step.gpu_ms)
    return [g for g in groups if g["steps"]]


def period_markdown(label: str, groups: list[dict]) -> list[str]:
    """A table of period_by_batch's groups, in seconds."""
    lines = [f"{label}: steps by batch size, their loop period against their GPU time (s)", "",
             "| sequences | steps | period | GPU | runner host | period over GPU |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for g in groups:
        lines.append(f"| {g['seqs']} | {g['steps']} | {g['period_ms'] / 1e3:.3f} | {g['gpu_ms'] / 1e3:.3f} | "
                     f"{g['host_ms'] / 1e3:.3f} | {g['period_over_gpu_ms'] / 1e3:.3f} |")  # fmt: skip
    return lines


# Steps listed one by one at the start of a run: the service's first steps (a burst still arriving, the
# worker's first admissions) took 36-46 ms of runner host time in 1-3 one-sequence steps where the offline
# engine's first steps took ~1 ms each (H100, 2026-11-27); the groups above cannot say which.
FIRST_STEPS = 8


def first_steps(records: list, n: int = FIRST_STEPS) -> list[dict]:
    """The run's first n steps, each: sequences, tokens, graphed, period (ms; None for the run's last step),
    GPU time, runner host time and the wait for its tokens (ms)."""
    rows = []
    for i, step in enumerate(records[:n]):
        after = records[i + 1] if i + 1 < len(records) else None
        rows.append({"seqs": step.num_seqs, "tokens": step.num_tokens, "graphed": step.graphed,
                     "period_ms": None if after is None else (after.started_s - step.started_s) * 1e3,
                     "gpu_ms": step.gpu_ms, "host_ms": step.host_s * 1e3, "wait_ms": step.wait_s * 1e3})  # fmt: skip
    return rows


def first_steps_markdown(label: str, rows: list[dict]) -> list[str]:
    """A table of first_steps' rows, in ms."""
    lines = [f"{label}: the first {len(rows)} steps (ms)", "",
             "| step | sequences | tokens | graphed | period | GPU | runner host | token wait |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, r in enumerate(rows):
        period = "-" if r["period_ms"] is None else f"{r['period_ms']:.2f}"
        lines.append(f"| {i} | {r['seqs']} | {r['tokens']} | {'yes' if r['graphed'] else 'no'} | {period} | "
                     f"{r['gpu_ms']:.2f} | {r['host_ms']:.2f} | {r['wait_ms']:.2f} |")  # fmt: skip
    return lines
