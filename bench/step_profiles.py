"""Where a decode step's GPU time goes, by kernel (torch.profiler, on CUDA): bench/decode_latency.py's
two profiles and their markdown.

- `profile_eager_steps`: a few eager steps, each kernel's GPU time summed by kind. Under PDL a kernel
  launched early counts its wait on the kernel before it, so these are attribution, not cost.
- `profile_graph_steps`: a few graphed steps (what the benchmark times), each kernel's share of the
  stream's timeline. Kernels are taken in start order; a kernel's `marginal` time is how far it moves
  the end of the work done so far (its end minus the latest end before it, or its whole duration when it
  starts after an idle gap), so the marginals plus the gaps add up to the span, and a kernel that runs
  under the one before it (PDL) is charged only for what it adds. `gap_before` is the idle time before
  it starts: launch latency inside a graph, the host between steps.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

KINDS = ("gemm", "attention", "norm", "rope", "kv_store", "silu_mul", "other")
STREAM_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")  # chrome-trace categories that occupy the stream
NAME_CHARS = 60


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for needle, kind in (("gemm", "gemm"), ("gemv", "gemm"), ("cutlass", "gemm"), ("nvjet", "gemm"),
                         ("decode", "attention"), ("combine", "attention"), ("merge", "attention"),
                         ("rms", "norm"), ("rope", "rope"), ("store_kv", "kv_store"),
                         ("silu", "silu_mul")):  # fmt: skip
        if needle in lowered:
            return kind
    return "other"


def _start_request(engine, request_id: str, prompt: list[int], graphs: bool, tokens: int, steps_before: int):
    import torch

    from engine.sampling_params import SamplingParams

    if engine.runner.graphs is not None:
        engine.runner.graphs.enabled = graphs
    engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    for _ in range(steps_before):  # the prefill (and warm steps) outside the profile
        engine.step()
    torch.cuda.synchronize()  # async scheduling: the last of them may still be running


def profile_eager_steps(engine, prompt: list[int], num_steps: int = 4) -> dict:
    """GPU time of a few eager decode steps by kernel kind, in us per step."""
    from torch.profiler import ProfilerActivity, profile

    _start_request(engine, "profile", prompt, graphs=False, tokens=num_steps + 1, steps_before=1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        while engine.has_unfinished_requests():
            engine.step()
    kinds = dict.fromkeys(KINDS, 0.0)
    others: dict[str, float] = {}
    by_name: dict[str, tuple[float, float]] = {}
    for event in prof.key_averages():
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        if us > 0:
            us_sum, calls = by_name.get(event.key[:NAME_CHARS], (0.0, 0.0))
            by_name[event.key[:NAME_CHARS]] = (us_sum + us / num_steps, calls + event.count / num_steps)
        kind = kernel_kind(event.key)
        kinds[kind] += us / num_steps
        if kind == "other" and us > 0:
            others[event.key[:80]] = others.get(event.key[:80], 0.0) + us / num_steps
    result = {k: round(v, 1) for k, v in kinds.items()}
    # what "other" is made of: the five largest by GPU time (names cut to 80 characters)
    result["other_top"] = {k: round(v, 1) for k, v in sorted(others.items(), key=lambda kv: -kv[1])[:5]}
    # every kernel by name (GPU us per step, calls per step), largest first: which one moved in an A/B
    result["kernels"] = {k: [round(us, 1), round(calls, 1)] for k, (us, calls) in sorted(
        by_name.items(), key=lambda kv: -kv[1][0])[:12]}  # fmt: skip
    return result


def stream_events(trace: dict) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of what ran on the GPU, in start order, from a chrome trace."""
    on_gpu = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in STREAM_EVENTS]
    return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e.get("name", ""))) for e in on_gpu)


def timeline_shares(events: list[tuple[float, float, str]], num_steps: int) -> dict:
    """Per kernel name (calls, us inside it, marginal us, gap-before us, all per step) and the step's
    span, busy and idle time, from stream events in start order (see the module docstring)."""
    if not events:
        return {"error": "the profile holds no GPU events (no CUPTI records of graph kernels?)"}
    shares: dict[str, list[float]] = {}
    latest_end = events[0][0]
    gaps = []
    for start, end, name in events:
        gap = max(0.0, start - latest_end)
        marginal = max(0.0, end - max(start, latest_end))
        latest_end = max(latest_end, end)
        gaps.append(gap)
        share = shares.setdefault(name[:NAME_CHARS], [0.0, 0.0, 0.0, 0.0])
        share[0] += 1
        share[1] += end - start
        share[2] += marginal
        share[3] += gap
    span = latest_end - events[0][0]
    idle = sum(gaps)
    kernels = {name: [round(v / num_steps, 2) for v in share]
               for name, share in sorted(shares.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))}  # fmt: skip
    return {
        "steps": num_steps,
        "events_per_step": round(len(events) / num_steps, 1),
        "span_us_per_step": round(span / num_steps, 1),
        "busy_us_per_step": round((span - idle) / num_steps, 1),
        "idle_us_per_step": round(idle / num_steps, 1),
        "gaps_over_5us_per_step": round(sum(g > 5.0 for g in gaps) / num_steps, 2),
        "idle_in_gaps_over_5us_per_step": round(sum(g for g in gaps if g > 5.0) / num_steps, 1),
        # name -> [calls, us inside the kernel, marginal us, gap-before us], each per step
        "kernels": kernels,
    }


def profile_graph_steps(engine, prompt: list[int], num_steps: int = 16) -> dict:
    """The graphed decode steps' timeline by kernel (see the module docstring), per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if engine.runner.graphs is None:
        return {"error": "the engine runs without CUDA graphs"}
    _start_request(engine, "graph-profile", prompt, graphs=True, tokens=num_steps + 8, steps_before=4)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished_requests():
        engine.step()
    return profiled_timeline(prof, num_steps)


def profiled_timeline(prof, num_steps: int) -> dict:
    """timeline_shares of a finished torch.profiler run's stream events (through its chrome trace)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return timeline_shares(stream_events(trace), num_steps)


def profiles_markdown(results: dict) -> list[str]:
    """The eager profile's table by kind and, per model, the graph profile's largest kernels."""
    from bench.report import table

    parts: list[str] = []
    profiles = [(n, r["eager_profile_us_per_step"]) for n, r in results["models"].items()
                if "eager_profile_us_per_step" in r]  # fmt: skip
    if profiles:
        kinds = [k for k in profiles[0][1] if k not in ("other_top", "kernels")]
        parts += ["", "GPU time per eager decode step by kernel kind (torch.profiler, us; the fused RoPE + KV "
                  "store counts under rope, the split merge under attention):", "",
                  table([{"model": n, **p} for n, p in profiles], [("model", "model", "")] +
                        [(k, k, ".0f") for k in kinds])]  # fmt: skip
        for name, profile in profiles:
            top = "; ".join(f"`{k}` {v:.0f}" for k, v in profile.get("other_top", {}).items())
            if top:
                parts.append(f"\n{name}, largest 'other' kernels (us per step): {top}")
    for name, r in results["models"].items():
        graph = r.get("graph_profile")
        if not graph:
            continue
        if "error" in graph:
            parts += ["", f"{name}, graphed steps' timeline: {graph['error']}"]
            continue
        rows = [{"kernel": f"`{k}`", "calls": v[0], "inside": v[1], "marginal": v[2], "gap": v[3]}
                for k, v in list(graph["kernels"].items())[:14]]  # fmt: skip
        parts += [
            "",
            f"{name}, graphed decode steps' timeline (torch.profiler over {graph['steps']} steps, us per step): span "
            f"{graph['span_us_per_step']:.1f}, busy {graph['busy_us_per_step']:.1f}, idle "
            f"{graph['idle_us_per_step']:.1f} ({graph['idle_in_gaps_over_5us_per_step']:.1f} in gaps over 5 us). "
            "'marginal': how far the kernel moves the end of the work before it; 'gap': idle time before it "
            "starts (bench/step_profiles.py).",
            "",
            table(
                rows,
                [
                    ("kernel", "kernel", ""),
                    ("calls", "calls", ".0f"),
                    ("inside", "us inside", ".1f"),
                    ("marginal", "us marginal", ".1f"),
                    ("gap", "us gap before", ".1f"),
                ],
            ),  # fmt: skip
        ]
    return parts
