"""The service benchmark's markdown report (bench/service_overhead.py writes it beside the JSON)."""

from __future__ import annotations

from bench.loop_cycles import ENGINE_COLUMNS, cycles_markdown
from bench.redis_stalls import stalls_line
from bench.step_reads_clock import clock_line


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _host(meta: dict) -> str:
    """The host's CPU; meta comes from the offline engine's process, which --isolate-worker pins."""
    if "cpu" not in meta:
        return ""
    usable = meta.get("cpus_usable", meta["cpus"])
    pinned = f", the engines pinned to {usable}" if usable < meta["cpus"] else ""
    return f" · host {meta['cpu']}, {meta['cpus']} CPUs{pinned}"


def timeline_line(timeline: dict | None) -> str:
    if not timeline:
        return "No timeline of the throughput run (a worker without step times)."
    t = timeline
    return (
        f"Timeline of the throughput run (s after the first request was sent): the worker's first read of a "
        f"message {_s(t.get('first_read'))}, its first admission {_s(t.get('first_admit'))}, its first engine step "
        f"{t['first_step']:.3f}, the first token at a client {t['first_token']:.3f}, the last request sent "
        f"{t['last_sent']:.3f}, the worker's last engine step {t['last_step']:.3f}, the last response's end "
        f"{t['last_end']:.3f}; so {t['first_step'] + t['last_end'] - t['last_step']:.3f} s of the run lie outside "
        "the worker's stepping." + _intake_text(t)
    )


def _intake_text(t: dict) -> str:
    if "all_in_redis" not in t:
        return ""
    return (
        f" The burst's intake (the messages' stream ids, Redis's clock, ms resolution): half of the requests were "
        f"in Redis by {t['half_in_redis']:.3f} s and all by {t['all_in_redis']:.3f} s; the worker had admitted "
        f"half by {t['half_admitted']:.3f} s and all by {t['all_admitted']:.3f} s."
    )


def phases_line(phases: dict | None) -> str:
    if not phases:
        return ""
    p = phases["phases_s"]
    return (
        f"Inside the worker over the throughput run ({phases['window_s']:.2f} s, {phases['steps']} engine steps, "
        f"mean decode batch {phases['mean_decode_batch']:.0f}): engine steps {p.get('engine.step', 0):.2f} s "
        f"(GPU busy {phases['gpu_busy_s']:.2f} s; host in the runner {phases['runner_host_s']:.2f} s, blocked on "
        f"the GPU {phases['blocked_s']:.2f} s, scheduler/detokenizer/outputs {phases['engine_host_s']:.2f} s), "
        f"events and bookkeeping after the step {p.get('_step', 0) - p.get('engine.step', 0):.2f} s, admitting "
        f"while running {p.get('_admit_if_due', 0):.2f} s, the steps' reads sent "
        f"{p.get('_read_during_step', 0) + p.get('_send_reads_for_step', 0):.2f} s (during each step's forward pass "
        f"before 2026-11-27 13:00, before the engine schedules the step since), intake while idle "
        f"{p.get('_intake', 0):.2f} s "
        f"(waiting for work: {p.get('_intake_idle', 0):.2f} s), replies of the steps' reads "
        f"(cancel check, new messages) {p.get('_finish_step_reads', 0):.2f} s (inside 'events and bookkeeping'; "
        f"of it, reading the replies off the socket {p.get('step_reads.receive', 0):.2f} s), "
        f"building the step's events {p.get('events_for_outputs', 0):.2f} s and handing batches to the publisher "
        f"{p.get('publisher.submit', 0):.2f} s (both inside it too), "
        f"cancel checks of their own {p.get('_check_cancels', 0):.2f} s, "
        f"loop total {p.get('_iteration', 0):.2f} s." + _gc_text(phases)
    )


def _gc_text(phases: dict) -> str:
    """The garbage collector's pauses in the window (runs before 2026-11-24 13:30 did not record them)."""
    if "gc_s" not in phases:
        return ""
    count, seconds = phases["gc_count"], phases["gc_s"]
    return (
        f" Garbage collections in the worker (thresholds {tuple(phases['gc_threshold'])}): "
        + ", ".join(f"generation {g}: {count[g]} taking {seconds[g]:.3f} s" for g in range(3))
        + "."
    )


def _client_words(svc: dict) -> str:
    """The load generator: results before 2026-11-27 05:00 used httpx and do not say so."""
    if svc.get("client", "httpx") == "httpx":
        return "httpx clients"
    return "socket clients (bench/socket_clients.py: one write a request, the response read as bytes)"


def periods_lines(offline: list[dict] | None, service: list[dict] | None) -> list[str]:
    """Both paths' seed-0 steps by batch size (bench/step_periods.py): where the device waited for the host.
    Results written before 2026-11-27 02:00 have neither."""
    from bench.step_periods import period_markdown

    if not offline or not service:
        return []
    return [*period_markdown("Offline engine", offline), "", *period_markdown("Service worker", service), ""]


def first_steps_lines(off: dict, svc: dict) -> list[str]:
    """Both paths' first seed-0 steps one by one (bench/step_periods.py) and the Triton kernel variants each
    looked up while timed (bench/kernel_variants.py); results before 2026-11-27 05:00 have neither."""
    from bench.step_periods import first_steps_markdown

    phases = svc.get("worker_phases") or {}
    if not off.get("first_steps") or not phases.get("first_steps"):
        return []
    lines = [*first_steps_markdown("Offline engine", off["first_steps"]), "",
             *first_steps_markdown("Service worker", phases["first_steps"]), ""]  # fmt: skip
    off_v, svc_v = off.get("kernel_variants"), phases.get("kernel_variants")
    if off_v and svc_v:
        lines += [
            "Triton kernel variants looked up (built or loaded from the disk cache) while timed: offline engine "
            f"{off_v['count']} ({off_v['seconds']:.3f} s; its throughput runs and TTFT requests) {off_v['first']}, "
            f"worker {svc_v['count']} ({svc_v['seconds']:.3f} s; its throughput run) {svc_v['first']}.",
            "",
        ]
    return lines


def repeats_line(r: dict) -> str:
    """The repeated runs, when there were more than one."""
    off_runs, svc_runs = r["offline"].get("runs", []), r["service"].get("runs", [])
    if len(off_runs) < 2 or len(svc_runs) != len(off_runs):
        return ""
    pairs = "; ".join(
        f"seed {o['seed']}: offline {o['output_tok_s']:,.0f}, service {s['output_tok_s']:,.0f} "
        f"({s['output_tok_s'] / o['output_tok_s']:.1%})"
        for o, s in zip(off_runs, svc_runs, strict=True)
    )
    return (
        f"The throughput workload ran {len(off_runs)} times on each path, at seeds {[o['seed'] for o in off_runs]} "
        "(the engines stay warm; no prompt is shared between seeds), output tok/s: "
        f"{pairs}. The table gives each path's median run and the fraction of the medians; the CPU shares, the "
        "worker's phases and the timeline are of the seed-0 run."
    )


def markdown(r: dict) -> str:
    from bench.report import table

    meta, off, svc, w = r["meta"], r["offline"], r["service"], r["workload"]
    rows = [
        {"what": "offline engine (in process)", "s": off["elapsed_s"], "out": off["output_tok_s"],
         "total": off["total_tok_s"], "ttft": r["ttft_p50_ms"]["offline"]},
        {"what": "service (HTTP + Redis + worker)", "s": svc["elapsed_s"], "out": svc["output_tok_s"],
         "total": svc["total_tok_s"], "ttft": r["ttft_p50_ms"]["service"],
         "frac": r["throughput_frac_of_offline"], "added": r["ttft_p50_ms"]["added"]},
    ]  # fmt: skip
    cpu = ", ".join(f"{k} {v:.0%}" for k, v in svc["cpu_frac_of_elapsed"].items())
    return "\n".join([
        "# inferq service overhead",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · "
        f"transformers {meta['transformers']} · python {meta['python']}"
        + _host(meta),
        "",
        f"{r['model']} shape, random bf16 weights. Throughput: seed 0, {w['num_seqs']} sequences, prompt and output "
        f"lengths uniform in [{w['min_len']}, {w['max_len']}], random token ids, ignore_eos, greedy; max_num_seqs "
        f"{w['max_num_seqs']}, max_num_batched_tokens {w['max_num_batched_tokens']}. The service gets the workload "
        f"from {w['num_seqs']} concurrent streaming clients (POST /v1/completions, token-id prompts, "
        f"{svc['client_procs']} client processes of {_client_words(svc)}, "
        + (
            "each client's connection opened and its request encoded before the clock starts"
            if svc.get("warm_clients")
            else "connections opened and requests encoded on the clock"
        )
        + f"), through {svc.get('api_replicas', 1)} `python -m api` "
        "process(es) (uvicorn; client processes spread over them), a private "
        f"redis-server (AOF everysec; the API's Redis pool set to {svc['api_redis_max_connections']} connections: "
        "its streams share one pub/sub connection per process) "
        f"and one worker (batch window {svc['batch_window_ms']:g} ms"
        + (
            f", closed early after {svc['batch_window_gap_ms']:g} ms without arrivals"
            if "batch_window_gap_ms" in svc
            else ""
        )
        + "); "
        "the offline "
        "engine ran the same workload in its own process just before. TTFT: "
        f"{w['ttft_requests']} sequential requests, {w['ttft_prompt_tokens']}-token prompt, "
        f"{w['ttft_new_tokens']} new tokens, p50 (service: first streamed token at the client; offline: "
        "add_request to the step that returns it)."
        + (
            f" CPUs: the worker (and the offline engine before it) pinned to {svc['worker_cpus']}, redis, the API "
            f"and the clients to the other {svc['other_cpus']} logical CPUs."
            if svc.get("worker_cpus")
            else " CPUs: not pinned (worker, API, redis and the clients share every CPU)."
        ),
        "",
        table(rows, [("what", "path", ""), ("s", "time s", ".2f"), ("out", "output tok/s", ",.0f"),
                     ("total", "total tok/s", ",.0f"), ("frac", "of offline", ".1%"),
                     ("ttft", "TTFT p50 ms", ".1f"), ("added", "added TTFT p50 ms", ".1f")]),  # fmt: skip
        "",
        f"Goals: >= {r['goals']['throughput_frac']:.0%} of the offline throughput; <= "
        f"{r['goals']['added_ttft_p50_ms']:g} ms added TTFT p50. At low load the API answered with its headers "
        f"(request validated, admitted and queued in Redis) after {svc['headers_p50_ms']:.1f} ms (p50). "
        "Under the full load the service's TTFT was "
        f"p50 {svc['loaded_ttft_p50_ms']:.0f} ms, p99 {svc['loaded_ttft_p99_ms']:.0f} ms. CPU used during the "
        f"throughput run, as a fraction of its wall time (1 = one core busy): {cpu}.",
        "",
        repeats_line(r),
        "",
        phases_line(svc.get("worker_phases")),
        clock_line((svc.get("worker_phases") or {}).get("step_reads_clock")),
        stalls_line(svc.get("redis_stalls")),
        "",
        timeline_line(svc.get("timeline_s")),
        "",
        *periods_lines(off.get("period_by_batch"), (svc.get("worker_phases") or {}).get("period_by_batch")),
        *first_steps_lines(off, svc),
        *cycles_markdown(off.get("loop_cycles") or [], "Offline engine", ENGINE_COLUMNS),
        *cycles_markdown((svc.get("worker_phases") or {}).get("loop_cycles") or []),
    ])  # fmt: skip
