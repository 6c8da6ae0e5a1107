"""Service overhead (BENCHMARKS.md): the offline throughput workload sent through the whole
service (HTTP API, Redis, worker) on the GPU machine, against the offline engine measured in
the same run; and the time to first token the service adds at low load.

    python -m bench.service_overhead              # on a CUDA GPU, from the repo root
    python -m bench.service_overhead --dry-run    # CPU: tiny shape, few sequences, code paths only

Phases, each engine in its own process so that the GPU is free for the next:
1. offline: bench/offline_throughput.py's engine and workload (seed 0, 256 sequences, prompt and
   output lengths uniform in [100, 1024], random token ids, ignore_eos, greedy), then TTFT_REQUESTS
   sequential single requests (TTFT_PROMPT-token prompt, TTFT_NEW_TOKENS new tokens) timed from
   add_request to the step that returns their first token.
2. service: a private redis-server, a worker (worker.loop.Worker over the same engine: `python -m
   worker` cannot build random weights, so a child of this module builds the engine exactly as
   phase 1 does and hands it to Worker) and `python -m api`; the same sequential requests, then
   the workload from NUM_SEQS concurrent streaming clients (POST /v1/completions, prompt as token
   ids, stream, max_tokens = output length, ignore_eos, temperature 0), spread over CLIENT_PROCS
   processes so that the clients are not the bottleneck.
Both engines get the same warm-up (8 short sequences) before they are timed; the service also
gets a few warm-up requests through HTTP. Writes service_overhead.{json,md} into $OUT, and the
logs of the API and the worker beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis

from bench import redis_stalls
from bench.offline_throughput import MAX_NUM_BATCHED_TOKENS, NUM_SEQS, workload
from bench.report import OUT_HELP, results_folder
from bench.service_clients import CLIENT_KINDS, CLIENT_PROCS, SERVED_NAME, run_clients, sequential
from bench.service_processes import (
    STEM,
    cpu_s,
    read_when_written,
    start_profiler,
    stop_profiler,
    worker_cpu_split,
)
from bench.service_report import markdown
from bench.service_stack import API_REDIS_MAX_CONNECTIONS, running_stack
from bench.service_workload import (
    engine_ttfts,
    median_run,
    more_workloads,
    percentile,
    repeat_seeds,
    run_figures,
    shape,
    workloads,
)
from worker.window import DEFAULT_GAP_FRACTION

MODEL = "Qwen3-0.6B"
API_REPLICAS = 4  # the benchmark's service: four stateless API processes in front of one worker
BATCH_WINDOW_MS = 1.0
THROUGHPUT_GOAL, TTFT_GOAL_MS = 0.95, 5.0


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 8 short sequences")
    parser.add_argument("--batch-window-ms", type=float, default=BATCH_WINDOW_MS)
    parser.add_argument("--num-seqs", type=int, default=None, help="override the workload's sequence count")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the throughput workload this many times, at seeds 0, 1, ... (both engines stay warm; no prompt "
        "is shared between seeds), and report the median of each path",
    )
    parser.add_argument(
        "--api-replicas",
        type=int,
        default=API_REPLICAS,
        help="API processes (stateless replicas); clients spread over them. Another count than the benchmark's "
        "writes service_overhead_<n>api.{json,md}",
    )
    parser.add_argument(
        "--isolate-worker",
        action="store_true",
        help="pin the worker to two physical cores of its own and redis, the API and the clients to the rest "
        "(as a deployment gives a GPU worker its cores; the load generator shares this machine only here)",
    )
    parser.add_argument(
        "--client",
        choices=CLIENT_KINDS,
        default="socket",
        help="the load generator: 'socket' (bench/socket_clients.py: one write a request, the response read as "
        "bytes) or 'httpx' (every run before 2026-11-27 05:00; its own CPU and per-request work spread the burst)",
    )
    parser.add_argument(
        "--cold-clients",
        action="store_true",
        help="the clients open their connections and encode their requests on the clock, all at the start "
        "(as every run before 2026-11-24 13:00 did); by default they do both before the start",
    )
    parser.add_argument(
        "--worker-gc-threshold0",
        type=int,
        default=None,
        help="an experiment: the worker child's first garbage-collector threshold (gc.set_threshold)",
    )
    parser.add_argument("--child", choices=("offline", "worker"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)  # the worker child's
    args = parser.parse_args(argv)
    if args.cold_clients and args.client != "httpx":
        parser.error("--cold-clients needs --client httpx (the socket clients always connect before the clock)")
    return args


def _warm_engine(engine) -> None:
    """The warm-up of bench/offline_throughput.py: 8 short sequences (compiles the mixed-batch kernels)."""
    from bench.offline_throughput import run_workload

    warm_prompts, _, warm_outputs = workload(engine.vocab_size, 8, 16, 300, seed=1)
    run_workload(engine, warm_prompts, [min(o, 16) for o in warm_outputs])


# ---- phase 1: the offline engine (child process) -------------------------------------------------
def _offline_child(args: argparse.Namespace) -> None:
    import torch

    from bench.engine_common import environment
    from bench.offline_throughput import build_engine, run_workload
    from bench.step_periods import first_steps, period_by_batch
    from engine.step_timer import StepTimer

    device = torch.device("cpu" if args.dry_run else "cuda")
    directory = Path(args.model_dir)
    engine = build_engine(directory, device, args.dry_run)
    prompts, prompt_lens, output_lens, ttft_prompts = workloads(engine.vocab_size, args.dry_run, args.num_seqs)
    _warm_engine(engine)
    # NOTE: timed with the step timer, as the worker child's engine is (bench/worker_phases.py) and as
    # bench/offline_throughput.py's is: both paths pay its events, and the first run's periods compare with the
    # worker's
    engine.runner.timer = timer = StepTimer(engine.device)
    from bench.kernel_variants import VariantLog
    from bench.loop_cycles import LoopCycles, time_engine_steps

    variants = VariantLog().install()
    cycles = LoopCycles()
    untimed_step = time_engine_steps(engine, timer, cycles)
    runs = [run_figures(0, run_workload(engine, prompts, output_lens), prompt_lens, output_lens)]
    engine.step = untimed_step
    periods, starts = period_by_batch(timer.records), first_steps(timer.records)
    for seed, more_prompts, more_prompt_lens, more_output_lens in more_workloads(
        engine.vocab_size, args.dry_run, args.num_seqs, args.repeats
    ):
        elapsed = run_workload(engine, more_prompts, more_output_lens)
        runs.append(run_figures(seed, elapsed, more_prompt_lens, more_output_lens))
    engine.runner.timer = None
    ttfts = engine_ttfts(engine, ttft_prompts, shape(args.dry_run)[5])
    median = median_run(runs)
    result = {
        "meta": environment(device),
        "elapsed_s": median["elapsed_s"],
        "output_tok_s": median["output_tok_s"],
        "total_tok_s": median["total_tok_s"],
        "runs": runs,
        "ttft_ms": ttfts,
        "kv_pool_tokens": engine.stats().num_total_blocks * engine.stats().block_size,
        "period_by_batch": periods,
        "first_steps": starts,
        "loop_cycles": cycles.summary(),
        "kernel_variants": variants.summary(),  # looked up in the timed runs and the TTFT requests
    }
    Path(args.result).write_text(json.dumps(result))


# ---- phase 2: the worker (child process) -----------------------------------------------------------
def _worker_child(args: argparse.Namespace) -> None:
    import logging

    import torch

    from bench.offline_throughput import build_engine
    from worker.loop import Worker
    from worker.settings import WorkerSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    device = torch.device("cpu" if args.dry_run else "cuda")
    settings = WorkerSettings(
        redis_url=args.redis_url,
        model=args.model_dir,
        served_model_name=SERVED_NAME,
        device=device.type,
        max_num_seqs=NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        batch_window_ms=args.batch_window_ms,
        metrics_port=args.metrics_port,
    )
    # the scheduler the worker's settings ask for (priority, the background cap), as `python -m worker` builds it
    engine = build_engine(Path(args.model_dir), device, args.dry_run, settings.scheduling_policy,
                          settings.max_background_seqs)  # fmt: skip
    _warm_engine(engine)
    worker = Worker(settings, engine)
    if args.worker_gc_threshold0 is not None:
        import gc

        gc.set_threshold(args.worker_gc_threshold0, *gc.get_threshold()[1:])
    if args.result:
        from bench.worker_phases import WorkerPhases

        WorkerPhases(worker, Path(args.result))  # SIGUSR1 / SIGUSR2 from the parent bracket the run
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.request_stop(force=True))
    worker.run()


# ---- phase 2: the service (this process) -----------------------------------------------------------
def _measure_service(args, directory: Path, out: Path) -> dict:
    # NOTE: imported here, not at the top: bench.engine_common imports torch, and the client processes (spawned)
    # import this module again, which would then take longer than their start lead
    from bench.engine_common import vocab_size_of

    prompts, prompt_lens, output_lens, ttft_prompts = workloads(vocab_size_of(directory), args.dry_run, args.num_seqs)
    split = worker_cpu_split() if args.isolate_worker else None
    if args.isolate_worker and split is None:
        raise SystemExit("--isolate-worker needs at least 4 CPUs besides the worker's two cores")
    all_cpus = os.sched_getaffinity(0)
    flags = (["--dry-run"] if args.dry_run else []) + (["--num-seqs", str(args.num_seqs)] if args.num_seqs else [])
    if args.worker_gc_threshold0 is not None:
        flags += ["--worker-gc-threshold0", str(args.worker_gc_threshold0)]
    phases_path = out / f"{STEM}_worker_phases_tmp.json"
    phases_path.unlink(missing_ok=True)
    worker_flags = ["--result", str(phases_path), "--batch-window-ms", str(args.batch_window_ms), *flags]
    try:
        with running_stack(out, directory, api_replicas=args.api_replicas, worker_flags=worker_flags,
                           split=split) as stack:  # fmt: skip
            base, bases, worker = stack.bases[0], stack.bases, stack.worker
            new_tokens = shape(args.dry_run)[5]
            warm, _, warm_out = workload(vocab_size_of(directory), 8, 16, 300, seed=3)
            run_clients(base, [(p, min(o, 16)) for p, o in zip(warm, warm_out, strict=True)], kind=args.client)
            sequential(base, ttft_prompts[:3], new_tokens, args.client)
            ttfts, headers_ms = sequential(base, ttft_prompts, new_tokens, args.client)
            pids = {"api": [a.pid for a in stack.apis], "worker": [worker.pid], "redis": [stack.redis.pid]}
            cpu_before = {name: sum(map(cpu_s, group)) for name, group in pids.items()}
            profiler = start_profiler(worker.pid, out)
            redis_client = redis.Redis.from_url(stack.redis_url)
            redis_stalls.reset(redis_client)
            worker.send_signal(signal.SIGUSR1)  # the worker's phase totals start now
            jobs = list(zip(prompts, output_lens, strict=True))
            rows, client_cpu, elapsed = run_clients(bases, jobs, not args.cold_clients, args.client)
            cpu = {name: sum(map(cpu_s, group)) - cpu_before[name] for name, group in pids.items()}
            worker.send_signal(signal.SIGUSR2)
            stalls = redis_stalls.collect(redis_client)
            redis_client.close()
            stop_profiler(profiler)
            worker_phases = read_when_written(phases_path, 10.0)
            runs = [run_figures(0, elapsed, prompt_lens, [r["output_tokens"] for r in rows])]
            for seed, more_prompts, more_prompt_lens, more_output_lens in more_workloads(
                vocab_size_of(directory), args.dry_run, args.num_seqs, args.repeats
            ):
                more_rows, _, more_elapsed = run_clients(
                    bases, list(zip(more_prompts, more_output_lens, strict=True)), not args.cold_clients, args.client
                )
                runs.append(run_figures(seed, more_elapsed, more_prompt_lens, [r["output_tokens"] for r in more_rows]))
            stack.service.check()
    finally:
        os.sched_setaffinity(0, all_cpus)
    loaded_ttft = [(r["first"] - r["start"]) * 1000 for r in rows]
    median = median_run(runs)
    # NOTE: the timeline, the CPU shares and the worker's phases are of the first (seed 0) run.
    return {
        "timeline_s": _timeline(rows, worker_phases),
        "elapsed_s": median["elapsed_s"],
        "output_tok_s": median["output_tok_s"],
        "total_tok_s": median["total_tok_s"],
        "runs": runs,
        "ttft_ms": ttfts,
        "headers_ms": headers_ms,
        "headers_p50_ms": percentile(headers_ms, 50),
        "worker_cpus": sorted(split[0]) if split else None,
        "other_cpus": len(split[1]) if split else None,
        "loaded_ttft_p50_ms": percentile(loaded_ttft, 50),
        "loaded_ttft_p99_ms": percentile(loaded_ttft, 99),
        "cpu_s": {**cpu, "clients": client_cpu},
        "cpu_frac_of_elapsed": {name: s / elapsed for name, s in {**cpu, "clients": client_cpu}.items()},
        "client_procs": CLIENT_PROCS,
        "client": args.client,
        "api_replicas": args.api_replicas,
        "warm_clients": not args.cold_clients,
        "batch_window_ms": args.batch_window_ms,
        "batch_window_gap_ms": args.batch_window_ms * DEFAULT_GAP_FRACTION,  # the worker's default gap
        "api_redis_max_connections": API_REDIS_MAX_CONNECTIONS,
        "worker_phases": worker_phases,
        "redis_stalls": stalls,
    }


def _timeline(rows: list[dict], phases: dict | None) -> dict | None:
    """Where the throughput run's wall time went, in seconds from the first request's send: the
    worker's first and last engine step (the ramp before, the tail after) and the clients' first
    token and last response end. Every process reads CLOCK_MONOTONIC (time.perf_counter)."""
    if not phases or phases.get("first_step_at") is None:
        return None
    t0 = min(r["start"] for r in rows)
    marks = {name: phases.get(f"{name}_at") for name in ("first_read", "first_admit")}
    # the burst's intake: when half and all of the messages the worker admitted were in Redis, and admitted
    in_redis = sorted(pair[0] for pair in phases.get("intake", []))
    admitted = sorted(pair[1] for pair in phases.get("intake", []))
    intake = {}
    if in_redis:
        half = (len(in_redis) + 1) // 2 - 1
        intake = {"half_in_redis": in_redis[half] - t0, "all_in_redis": in_redis[-1] - t0,
                  "half_admitted": admitted[half] - t0, "all_admitted": admitted[-1] - t0}  # fmt: skip
    return {
        **{name: (at - t0 if at is not None else None) for name, at in marks.items()},
        **intake,
        "first_step": phases["first_step_at"] - t0,
        "first_token": min(r["first"] for r in rows) - t0,
        "last_sent": max(r["start"] for r in rows) - t0,
        "last_step": phases["last_step_at"] - t0,
        "last_end": max(r["end"] for r in rows) - t0,
    }


def _result(args, offline: dict, service: dict, directory: Path) -> dict:
    num, lo, hi, ttft_n, ttft_len, ttft_new = shape(args.dry_run, args.num_seqs)
    off_p50, svc_p50 = percentile(offline["ttft_ms"], 50), percentile(service["ttft_ms"], 50)
    return {
        "meta": offline.pop("meta"),
        "model": args.model,
        "workload": {"num_seqs": num, "min_len": lo, "max_len": hi, "seed": 0,
                     "seeds": repeat_seeds(args.repeats),
                     "max_num_seqs": NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                     "ttft_requests": ttft_n, "ttft_prompt_tokens": ttft_len, "ttft_new_tokens": ttft_new},
        "offline": offline,
        "service": service,
        # medians of the repeats (with one run, that run); per seed in the runs' lists
        "throughput_frac_of_offline": service["output_tok_s"] / offline["output_tok_s"],
        "ttft_p50_ms": {"offline": off_p50, "service": svc_p50, "added": svc_p50 - off_p50},
        "goals": {"throughput_frac": THROUGHPUT_GOAL, "added_ttft_p50_ms": TTFT_GOAL_MS},
    }  # fmt: skip


def main(argv=None) -> dict | None:
    args = _parse_args(argv)
    if args.child == "offline":
        return _offline_child(args)
    if args.child == "worker":
        return _worker_child(args)
    from bench.engine_common import model_dir, write_results

    out = results_folder(args.out, args.dry_run)
    out.mkdir(parents=True, exist_ok=True)
    directory = model_dir(args.model, tiny=args.dry_run)
    result_path = out / f"{STEM}_offline_tmp.json"
    flags = (["--dry-run"] if args.dry_run else []) + (["--num-seqs", str(args.num_seqs)] if args.num_seqs else [])
    print("[service] phase 1: offline engine", flush=True)
    all_cpus = os.sched_getaffinity(0)
    split = worker_cpu_split() if args.isolate_worker else None
    if split is not None:
        os.sched_setaffinity(0, split[0])  # the offline engine gets the CPUs the worker will get
    subprocess.run([sys.executable, "-m", "bench.service_overhead", "--child", "offline", "--model-dir",
                    str(directory), "--result", str(result_path), "--repeats", str(args.repeats), *flags],
                   check=True)  # fmt: skip
    os.sched_setaffinity(0, all_cpus)
    offline = json.loads(result_path.read_text())
    result_path.unlink()
    print(f"[service] offline: {offline}", flush=True)
    print("[service] phase 2: the service", flush=True)
    service = _measure_service(args, directory, out)
    results = _result(args, offline, service, directory)
    stem = STEM if args.api_replicas == API_REPLICAS else f"{STEM}_{args.api_replicas}api"
    stem += "_isolated" if args.isolate_worker else ""
    stem += "_cold_clients" if args.cold_clients else ""
    stem += "_httpx" if args.client == "httpx" else ""
    write_results(out, stem, results, markdown(results))
    print(json.dumps(results, indent=1), flush=True)
    print(markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
