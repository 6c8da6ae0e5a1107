"""The Batch API (BENCHMARKS.md): a 10,000-line batch through the whole service against the offline engine on
the same workload, and interactive latency with and without a batch running.

    python -m bench.batch_api              # on a CUDA GPU, from the repo root (Qwen3-0.6B shape)
    python -m bench.batch_api --dry-run    # CPU: tiny shape, a few short lines, code paths only
    python -m bench.batch_api --batch-only # the offline engine and the batch alone (step 2b), ~2 minutes;
                                           # BENCH_PYSPY=1 samples the worker's stacks meanwhile
                                           # (service_overhead_worker_pyspy.txt, py-spy's raw format)

Workload (seed 0): LINES lines of the offline workload's shape at a quarter of its lengths (prompt and output
lengths each uniform in [25, 256]: the full [100, 1024] makes one pass of 10,000 lines ~5 minutes on an H100,
and the run does two), random token ids, ignore_eos, greedy, POST /v1/completions lines.

1. offline: bench/offline_throughput.py's engine (max_num_seqs 256), warmed, runs the LINES sequences
   (a child process, so that the GPU is free for the next phase).
2. the service (bench/service_stack.py: redis-server, the worker over the same engine, API replicas) and one
   Celery batch worker (`python -m batch`, INFERQ_BATCH_IN_FLIGHT lines in flight, sent only while fewer than
   INFERQ_BATCH_QUEUE_AHEAD messages wait unread in the request stream and the unfinished ones stay below the
   worker's slots plus that many or a quarter of them: batch/stream_room.py):
   a. capacity of the interactive shape (bench/online_latency.py's: prompts 100-300, outputs 90-270 tokens,
      CAPACITY_REQUESTS at once), then Poisson arrivals at 50% of it for --seconds: TTFT alone;
   b. the batch alone: upload, create, wait until completed; output tokens / (completed_at - create) against
      the offline engine's output tok/s (goal >= 90%);
   c. a second batch of the same file; once it runs at full width, the same 50% load for --seconds: TTFT
      with a batch running (goal p50 <= 1.5x of a.); then the batch is cancelled.
Writes batch_api.{json,md} into --out (bench/report.py's results_folder), the services' logs beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.offline_throughput import NUM_SEQS, workload
from bench.online_clients import run_open_loop
from bench.online_latency import (
    CAPACITY_REQUESTS,
    OUTPUT_LENS,
    PROMPT_LENS,
    load_figures,
    poisson_arrivals,
    requests_of,
)
from bench.report import OUT_HELP, results_folder
from bench.service_clients import SERVED_NAME
from bench.service_processes import free_port, start_profiler, stop_profiler
from bench.service_stack import running_stack
from bench.worker_backlog import WorkerBacklog

STEM = "batch_api"
MODEL = "Qwen3-0.6B"
LINES = 10_000
LINE_LENS = (25, 256)
LOAD = 0.5
IN_FLIGHT = 384  # above max_num_seqs (256): the stream's room (--queue-ahead), not this, bounds what waits unread
QUEUE_AHEAD = 8  # batch/settings.py's default
API_REPLICAS = 2
THROUGHPUT_GOAL, TTFT_RATIO_GOAL = 0.90, 1.5
DRY_RUN = {"lines": 48, "line_lens": (4, 12), "prompt_lens": (8, 24), "output_lens": (4, 12), "capacity": 12}


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals of each interactive load")
    parser.add_argument(
        "--line-lens",
        type=int,
        nargs=2,
        default=LINE_LENS,
        metavar=("LO", "HI"),
        help="the lines' prompt and output lengths (the offline workload's own: 100 1024)",
    )
    parser.add_argument("--in-flight", type=int, default=IN_FLIGHT, help="INFERQ_BATCH_IN_FLIGHT")
    parser.add_argument("--queue-ahead", type=int, default=QUEUE_AHEAD, help="INFERQ_BATCH_QUEUE_AHEAD")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, a few short lines")
    parser.add_argument("--batch-only", action="store_true",
                        help="the offline engine and the batch alone only (no interactive loads): a quicker look at "
                        "the batch's rate, written as batch_api_batch_only.json")  # fmt: skip
    parser.add_argument("--child", choices=("offline",), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _shape(args) -> dict:
    if args.dry_run:
        return dict(DRY_RUN, seconds=3.0)
    return {"lines": args.lines, "line_lens": tuple(args.line_lens), "prompt_lens": PROMPT_LENS,
            "output_lens": OUTPUT_LENS, "capacity": CAPACITY_REQUESTS, "seconds": args.seconds}  # fmt: skip


def _lines(vocab: int, shape: dict) -> tuple[list[list[int]], list[int]]:
    prompts, _, outputs = workload(vocab, shape["lines"], *shape["line_lens"], seed=0)
    return prompts, outputs


# ---- phase 1: the offline engine (child process) -------------------------------------------------
def _offline_child(args) -> None:
    import torch

    from bench.engine_common import environment
    from bench.offline_throughput import build_engine, run_workload
    from bench.service_overhead import _warm_engine

    device = torch.device("cpu" if args.dry_run else "cuda")
    engine = build_engine(Path(args.model_dir), device, args.dry_run)
    prompts, outputs = _lines(engine.vocab_size, _shape(args))
    _warm_engine(engine)
    elapsed = run_workload(engine, prompts, outputs)
    result = {"meta": environment(device), "elapsed_s": elapsed, "output_tokens": sum(outputs),
              "output_tok_s": sum(outputs) / elapsed}  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


# ---- phase 2: the service ------------------------------------------------------------------------------
def _jsonl(prompts: list[list[int]], outputs: list[int]) -> bytes:
    rows = []
    for i, (prompt, max_tokens) in enumerate(zip(prompts, outputs, strict=True)):
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0}  # fmt: skip
        rows.append(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body}))
    return ("\n".join(rows) + "\n").encode()


def _wait(http: httpx.Client, batch_id: str, done, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = http.get(f"/v1/batches/{batch_id}").json()
        if done(batch):
            return batch
        if batch["status"] in ("failed", "expired", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch_id}: {batch['status']}, {batch['request_counts']}")
        time.sleep(0.1)


def _interactive(bases: list[str], vocab: int, shape: dict, rate: float, seed: int) -> dict:
    due = poisson_arrivals(LOAD * rate, shape["seconds"], seed=seed)
    jobs = requests_of(len(due), vocab, shape["prompt_lens"], shape["output_lens"], seed=seed + 10)
    rows, start_at = run_open_loop(bases, [(t, p, n) for t, (p, n) in zip(due, jobs, strict=True)])
    return load_figures(rows, start_at, LOAD * rate)


def _upload(http: httpx.Client, prompts: list[list[int]], outputs: list[int]) -> str:
    upload = http.post("/v1/files", files={"file": ("lines.jsonl", _jsonl(prompts, outputs))},
                       data={"purpose": "batch"})  # fmt: skip
    upload.raise_for_status()
    return upload.json()["id"]


def _batch_alone(http: httpx.Client, file_id: str, outputs: list[int], stack, metrics_port: int, out: Path) -> dict:
    """The batch alone, with the worker's backlog and engine counts sampled (and, with BENCH_PYSPY=1, its stacks)."""
    profiler = start_profiler(stack.worker.pid, out)
    with WorkerBacklog(metrics_port) as backlog:
        started = time.time()
        batch = http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                               "completion_window": "24h"}).json()  # fmt: skip
        done = _wait(http, batch["id"], lambda b: b["status"] == "completed", timeout_s=400)
        ended = time.time()
    stop_profiler(profiler)
    lines = http.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()
    tokens = sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    if len(lines) != len(outputs) or tokens != sum(outputs):
        raise RuntimeError(f"the batch answered {len(lines)} lines, {tokens} tokens; expected {sum(outputs)}")
    return {"id": done["id"], "elapsed_s": ended - started, "output_tokens": tokens,
            "output_tok_s": tokens / (ended - started), "request_counts": done["request_counts"],
            "validating_s": done["in_progress_at"] - done["created_at"],
            "finalizing_s": done["completed_at"] - done["finalizing_at"],
            "worker_backlog": backlog.figures()}  # fmt: skip


def _measure_service(args, directory: Path, out: Path, shape: dict) -> dict:
    from bench.engine_common import vocab_size_of

    vocab = vocab_size_of(directory)
    prompts, outputs = _lines(vocab, shape)
    files_dir = tempfile.mkdtemp(prefix="inferq-bench-files-")
    os.environ["INFERQ_FILES_DIR"] = files_dir  # the API replicas and the batch worker share it
    metrics_port = free_port()
    worker_flags = (["--dry-run"] if args.dry_run else []) + ["--metrics-port", str(metrics_port)]
    with running_stack(out, directory, api_replicas=API_REPLICAS, worker_flags=worker_flags, stem=STEM) as stack:
        stack.service.start("batch", [sys.executable, "-m", "batch", "--loglevel", "WARNING"],
                            {"INFERQ_REDIS_URL": stack.redis_url, "INFERQ_BATCH_IN_FLIGHT": str(args.in_flight),
                             "INFERQ_BATCH_QUEUE_AHEAD": str(args.queue_ahead),
                             "INFERQ_MAX_FILE_BYTES": str(1 << 30)})  # fmt: skip
        warm = requests_of(8, vocab, shape["prompt_lens"], (4, 16), seed=3)
        run_open_loop(stack.bases, [(0.0, p, n) for p, n in warm])
        if args.batch_only:
            with httpx.Client(base_url=stack.bases[0], timeout=600) as http:
                batch = _batch_alone(http, _upload(http, prompts, outputs), outputs, stack, metrics_port, out)
            print(f"[batch] batch alone: {batch}", flush=True)
            stack.service.check()
            return {"batch": batch}
        burst = requests_of(shape["capacity"], vocab, shape["prompt_lens"], shape["output_lens"], seed=10)
        rows, start_at = run_open_loop(stack.bases, [(0.0, p, n) for p, n in burst])
        capacity = load_figures(rows, start_at, None)
        rate = capacity["completed_req_s"]
        print(f"[batch] interactive capacity {rate:.1f} req/s", flush=True)
        with WorkerBacklog(metrics_port) as backlog:
            alone = _interactive(stack.bases, vocab, shape, rate, seed=20)
        alone["worker_backlog"] = backlog.figures()
        print(f"[batch] interactive alone: TTFT {alone['ttft_ms']}, backlog {alone['worker_backlog']}", flush=True)
        with httpx.Client(base_url=stack.bases[0], timeout=600) as http:
            file_id = _upload(http, prompts, outputs)
            batch = _batch_alone(http, file_id, outputs, stack, metrics_port, out)
            print(f"[batch] batch alone: {batch}", flush=True)
            second = http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                    "completion_window": "24h"}).json()  # fmt: skip
            # Running at full width: a window of lines done (or, in a dry run, the whole short batch).
            width = min(args.in_flight, shape["lines"] // 4)
            running = _wait(http, second["id"], lambda b: b["request_counts"]["completed"] >= width, 120)
            before = running["request_counts"]["completed"]
            with WorkerBacklog(metrics_port) as backlog:
                loaded = _interactive(stack.bases, vocab, shape, rate, seed=20)  # the same arrivals as alone
            loaded["worker_backlog"] = backlog.figures()
            after = http.get(f"/v1/batches/{second['id']}").json()
            during = {"lines_completed_during_load": after["request_counts"]["completed"] - before,
                      "status_after_load": after["status"]}  # fmt: skip
            print(f"[batch] interactive with a batch running: TTFT {loaded['ttft_ms']}; {during}", flush=True)
            http.post(f"/v1/batches/{second['id']}/cancel")
            _wait(http, second["id"], lambda b: b["status"] in ("cancelled", "completed"), 120)
        stack.service.check()
    return {"capacity": capacity, "interactive_alone": alone, "batch": batch, "interactive_with_batch": loaded,
            "batch_during_load": during}  # fmt: skip


def _result(args, shape: dict, offline: dict, service: dict) -> dict:
    """The run's figures; TTFT only where the interactive loads ran (not under --batch-only)."""
    result = {
        "meta": offline.pop("meta"),
        "model": args.model,
        "shape": shape,
        "in_flight": args.in_flight,
        "queue_ahead": args.queue_ahead,
        "offline": offline,
        "service": service,
        "batch_frac_of_offline": service["batch"]["output_tok_s"] / offline["output_tok_s"],
        "goals": {"batch_frac_of_offline": THROUGHPUT_GOAL, "ttft_p50_ratio": TTFT_RATIO_GOAL},
    }
    if "interactive_alone" in service:
        alone, loaded = (service[k]["ttft_ms"]["p50"] for k in ("interactive_alone", "interactive_with_batch"))
        result["ttft_p50_ms"] = {"alone": alone, "with_batch": loaded, "ratio": loaded / alone if alone else None}
    return result


def markdown(result: dict) -> str:
    meta, shape, service, offline = result["meta"], result["shape"], result["service"], result["offline"]
    batch, ttft = service["batch"], result["ttft_p50_ms"]
    alone, loaded = service["interactive_alone"], service["interactive_with_batch"]

    def trio(p: dict) -> str:
        return " / ".join("-" if p[k] is None else f"{p[k]:.1f}" for k in ("p50", "p95", "p99"))

    ratio = "-" if ttft["ratio"] is None else f"{ttft['ratio']:.2f}x"

    def backlog(phase: dict) -> str:
        figures = phase.get("worker_backlog") or {}
        if figures.get("peak") is None:
            return "not sampled"
        return f"{figures['peak']:.0f} / {figures['mean']:.1f}"

    def engine(phase: dict) -> str:
        figures = phase.get("worker_backlog") or {}
        if figures.get("running_mean") is None:
            return "not sampled"
        return f"{figures['running_mean']:.0f} / {figures['waiting_mean'] or 0:.0f}"

    return "\n".join([
        "# inferq Batch API",
        "",
        f"{meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · {meta['date']}",
        "",
        f"{result['model']} shape, random bf16 weights. {shape['lines']:,} lines, prompt and output lengths uniform "
        f"in [{shape['line_lens'][0]}, {shape['line_lens'][1]}] (seed 0), random token ids, ignore_eos, greedy; "
        f"one Celery batch worker with {result['in_flight']} lines in flight, sent while fewer than "
        f"{result.get('queue_ahead', 'any')} messages wait unread in the stream and the unfinished ones stay below "
        "the worker's slots plus that many or a quarter of them, each answered as whole choices (one event a "
        "choice); the worker's priority policy (batch lines at priority 1000, read past its slots, at most "
        "INFERQ_MAX_BACKGROUND_SEQS of them started beside interactive requests).",
        "",
        "| path | elapsed s | output tok/s | of offline | goal |",
        "|---|---|---|---|---|",
        f"| offline engine | {offline['elapsed_s']:.1f} | {offline['output_tok_s']:,.0f} | 1.00 | |",
        f"| batch through the service | {batch['elapsed_s']:.1f} | {batch['output_tok_s']:,.0f} | "
        f"{result['batch_frac_of_offline']:.3f} | >= {THROUGHPUT_GOAL:.2f} |",
        "",
        f"Interactive: Poisson arrivals at {LOAD:.0%} of capacity ({service['capacity']['completed_req_s']:.1f} req/s "
        f"measured) for {shape['seconds']:.0f} s, prompts {shape['prompt_lens'][0]}-{shape['prompt_lens'][1]}, "
        f"outputs {shape['output_lens'][0]}-{shape['output_lens'][1]} tokens, streaming.",
        "",
        "| load | requests | errors | TTFT p50 / p95 / p99 ms | ITL p50 / p95 / p99 ms |",
        "|---|---|---|---|---|",
        f"| alone | {alone['requests']} | {alone['errors']} | {trio(alone['ttft_ms'])} | {trio(alone['itl_ms'])} |",
        f"| with a batch running | {loaded['requests']} | {loaded['errors']} | {trio(loaded['ttft_ms'])} | "
        f"{trio(loaded['itl_ms'])} |",
        "",
        f"TTFT p50 with a batch running: {ratio} of alone (goal <= {TTFT_RATIO_GOAL}x); the batch completed "
        f"{service['batch_during_load']['lines_completed_during_load']} lines meanwhile.",
        "",
        "The worker's unwritten event batches (inferq_worker_unwritten_event_batches, peak / mean of its /metrics "
        f"every 0.1 s): interactive alone {backlog(alone)}; the batch alone {backlog(batch)}; interactive with a "
        f"batch running {backlog(loaded)}.",
        "",
        f"The worker's engine, running / waiting requests (means of the same scrapes; {NUM_SEQS} slots): "
        "interactive alone "
        f"{engine(alone)}; the batch alone {engine(batch)}; interactive with a batch running {engine(loaded)}.",
        "",
    ])  # fmt: skip


def main(argv=None) -> dict | None:
    args = _parse_args(argv)
    if args.child == "offline":
        return _offline_child(args)
    from bench.engine_common import model_dir, write_results

    out = results_folder(args.out, args.dry_run)
    out.mkdir(parents=True, exist_ok=True)
    directory = model_dir(args.model, tiny=args.dry_run)
    shape = _shape(args)
    result_path = out / f"{STEM}_offline_tmp.json"
    flags = ["--dry-run"] if args.dry_run else []
    flags += ["--lines", str(args.lines), "--line-lens", *map(str, args.line_lens)]
    if args.dry_run:
        args.in_flight = min(args.in_flight, 8)
    print("[batch] phase 1: offline engine", flush=True)
    subprocess.run([sys.executable, "-m", "bench.batch_api", "--child", "offline", "--model-dir", str(directory),
                    "--result", str(result_path), *flags], check=True)  # fmt: skip
    offline = json.loads(result_path.read_text())
    result_path.unlink()
    print(f"[batch] offline: {offline['output_tok_s']:,.0f} output tok/s", flush=True)
    print("[batch] phase 2: the service", flush=True)
    service = _measure_service(args, directory, out, shape)
    results = _result(args, shape, offline, service)
    if args.batch_only:
        (out / f"{STEM}_batch_only.json").write_text(json.dumps(results, indent=2))
        print(f"[batch] batch alone {results['batch_frac_of_offline']:.3f} of offline", flush=True)
        return results
    write_results(out, STEM, results, markdown(results))
    print(markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
