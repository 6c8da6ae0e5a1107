"""Where a benchmarked engine's device waited for its host: the steps' records (engine/step_timer.py's
StepTiming) grouped by batch size, each group's loop period against its GPU time.

Why: the service benchmark's worker runs the offline engine's steps plus the service's own host work, and on
slower hosts the service falls to 85-92% of the offline engine (bench/results/h100/service_history.md); the
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
