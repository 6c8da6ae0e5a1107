"""Where the service's time to first token goes at low load: one request at a time through `python -m api`, a
private Redis and the worker, each request's marks on one clock (time.perf_counter: CLOCK_MONOTONIC in every
process).

    python -m bench.ttft_path                 # on a CUDA GPU: the service benchmark's Qwen3-0.6B shape
    python -m bench.ttft_path --dry-run       # CPU: the tiny shape, code paths only

Why: the service benchmark's added TTFT p50 sits at 3-7 ms against a 5 ms goal (bench/results/h100/
service_history.md) and says nothing of where it goes. Marks, per request (ms from the client's send):
the response headers; the worker's read of the message (it enters the batch window); admission start and end;
the engine step that launched its prefill, start and end; the step that read its first token, start and end;
the hand-over of that token's event to the publisher; the first token at the client (its SSE chunk off the
socket). The engine's own TTFT (add_request to the step that returns the token) is measured first, in this
process, over the same prompts.

The worker runs in a thread of this process (bench/service_overhead.py's engine, warmed; the publisher in its
own process as by default), the clients in a child process (bench/socket_clients.py), the API is one process.
Writes ttft_path.{json,md} into --out (default $OUT).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time
from pathlib import Path

from bench.api_submit_latency import MODEL, running_api
from bench.engine_common import model_dir, write_results
from bench.service_workload import engine_ttfts, shape, workload

# Consecutive marks of a request, and the name of the gap that ends at each.
MARKS = (
    ("read", "API intake (send to the worker's read)"),
    ("admit_start", "batch window"),
    ("admit_end", "admission"),
    ("prefill_start", "to the prefill step"),
    ("prefill_end", "prefill step (engine.step)"),
    ("token_start", "between the steps"),
    ("token_end", "the step that reads the token"),
    ("handed", "events built, handed to the publisher"),
    ("first", "publisher, Redis, API relay, client"),
)
WARM_REQUESTS = 3


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen3-0.6B")
    parser.add_argument("--requests", type=int, default=None, help="default: the service benchmark's TTFT count")
    parser.add_argument("--batch-window-ms", type=float, default=1.0)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


class WorkerMarks:
    """Wraps a Worker's methods to record, per request id, when each of its marks happened."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.marks: dict[str, dict[str, float]] = {}
        self._wrap(worker, "_receive", self._on_receive)
        self._wrap(worker, "_admit", self._on_admit)
        self._wrap(worker.engine, "step", self._on_step)
        self._wrap(worker.publisher, "submit", self._on_submit)

    @staticmethod
    def _wrap(owner, name: str, on_call) -> None:
        fn = getattr(owner, name)

        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            on_call(start, time.perf_counter(), args, result)
            return result

        setattr(owner, name, wrapped)

    def _mark(self, request_id: str, name: str, at: float) -> None:
        self.marks.setdefault(request_id, {}).setdefault(name, at)  # the first time only

    def _on_receive(self, start, end, args, result) -> None:
        for delivery in args[0]:
            fields = delivery.fields or {}
            request_id = fields.get(b"id", fields.get("id"))
            if request_id is not None:
                self._mark(request_id.decode() if isinstance(request_id, bytes) else request_id, "read", start)

    def _on_admit(self, start, end, args, result) -> None:
        for job in self.worker.jobs.values():
            self._mark(job.request_id, "admit_start", start)
            self._mark(job.request_id, "admit_end", end)

    def _on_step(self, start, end, args, outputs) -> None:
        for request_id in self.worker.engine.last_step.new_request_ids:
            self._mark(request_id, "prefill_start", start)
            self._mark(request_id, "prefill_end", end)
        for out in outputs:
            if out.new_token_ids:
                self._mark(out.request_id, "token_start", start)
                self._mark(out.request_id, "token_end", end)

    def _on_submit(self, start, end, args, result) -> None:
        for _, columns in args[0].tokens:
            for request_id in columns.request_ids:
                self._mark(request_id, "handed", end)


def _client_child(base: str, prompts: list[list[int]], new_tokens: int, queue) -> None:
    """One request at a time, 20 ms apart (the worker idle again), each connection opened and its request
    encoded before its clock starts; the rows go back through `queue`."""
    from bench.service_clients import sequential_rows

    queue.put(sequential_rows(base, prompts, new_tokens, "socket", gap_s=0.02))


def _marked(rows: list[dict]) -> list[dict]:
    """Per request: each mark's ms from the client's send. A synchronous engine (CPU) reads the token in the
    prefill's own step: that request has no token_start / token_end marks."""
    out = []
    for row in rows:
        at = {name: (row[name] - row["start"]) * 1000 for name, _ in MARKS if row.get(name) is not None}
        if at.get("token_start") == at.get("prefill_start"):
            at.pop("token_start", None)
            at.pop("token_end", None)
        at["headers"] = (row["headers"] - row["start"]) * 1000
        out.append(at)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(marked: list[dict], own_ttfts: list[float]) -> dict:
    """p50 of each mark and of each gap (a mark less the request's last mark before it, or the send)."""
    gap_values: dict[str, list[float]] = {name: [] for name, _ in MARKS}
    for at in marked:
        previous = 0.0
        for name, _ in MARKS:
            if name in at:
                gap_values[name].append(at[name] - previous)
                previous = at[name]
    service = _median([m["first"] for m in marked if "first" in m])
    engine = _median(own_ttfts)
    return {
        "requests": len(marked),
        "headers_p50_ms": _median([m["headers"] for m in marked]),
        "service_ttft_p50_ms": service,
        "engine_ttft_p50_ms": engine,
        "added_p50_ms": None if service is None or engine is None else service - engine,
        "gaps": [
            {"mark": name, "gap": label, "p50_ms": _median(gap_values[name]), "count": len(gap_values[name])}
            for name, label in MARKS
        ],  # fmt: skip
        "marks_p50_ms": {name: _median([m[name] for m in marked if name in m]) for name, _ in MARKS},
    }


def markdown(result: dict) -> str:
    s = result["summary"]
    lines = [
        "# inferq: where the low-load TTFT goes",
        "",
        f"{result['meta']} · {result['model']}{' (dry run, CPU)' if result['dry_run'] else ''}; "
        f"{s['requests']} requests one at a time, {result['prompt_tokens']}-token prompts, batch window "
        f"{result['batch_window_ms']:g} ms (bench/ttft_path.py).",
        "",
        f"Service TTFT p50 {s['service_ttft_p50_ms']:.2f} ms, the engine's own {s['engine_ttft_p50_ms']:.2f} ms "
        f"(added {s['added_p50_ms']:.2f} ms); response headers at {s['headers_p50_ms']:.2f} ms.",
        "",
        "| mark | ms from send (p50) | gap before it | gap p50 ms |",
        "|---|---|---|---|",
    ]
    for gap in s["gaps"]:
        at = s["marks_p50_ms"][gap["mark"]]
        at_text = "-" if at is None else f"{at:.2f}"
        gap_text = "-" if gap["p50_ms"] is None else f"{gap['p50_ms']:.2f}"
        lines.append(f"| {gap['mark']} | {at_text} | {gap['gap']} | {gap_text} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = _parse_args(argv)
    import torch

    from bench.engine_common import environment, vocab_size_of
    from bench.offline_throughput import build_engine
    from bench.service_overhead import _warm_engine
    from worker.loop import Worker
    from worker.settings import WorkerSettings

    device = torch.device("cpu" if args.dry_run else "cuda")
    directory = model_dir(args.model, tiny=args.dry_run)
    _, _, _, num_requests, prompt_len, new_tokens = shape(args.dry_run)
    num_requests = args.requests or num_requests
    prompts, _, _ = workload(vocab_size_of(directory), num_requests + WARM_REQUESTS, prompt_len, prompt_len, seed=2)
    engine = build_engine(directory, device, args.dry_run)
    _warm_engine(engine)
    own_ttfts = engine_ttfts(engine, prompts[WARM_REQUESTS:], new_tokens, prefix="engine-ttft")
    with running_api() as (base, client, _):
        port = client.connection_pool.connection_kwargs["port"]
        settings = WorkerSettings(redis_url=f"redis://127.0.0.1:{port}/0", model=str(directory),
                                  served_model_name=MODEL, device=device.type, batch_window_ms=args.batch_window_ms,
                                  metrics_port=0, _cli_parse_args=False)  # fmt: skip
        worker = Worker(settings, engine)
        marks = WorkerMarks(worker)
        thread = threading.Thread(target=worker.run, name="worker", daemon=True)
        thread.start()
        try:
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            child = context.Process(target=_client_child, args=(base, prompts, new_tokens, queue))
            child.start()
            rows = queue.get(timeout=600)
            child.join(30)
        finally:
            worker.request_stop(force=True)
            thread.join(30)
    ids = list(marks.marks)  # in arrival order: one request at a time
    if len(ids) != len(rows):
        raise SystemExit(f"the worker marked {len(ids)} requests, the clients sent {len(rows)}")
    for row, request_id in zip(rows, ids, strict=True):
        row.update(marks.marks[request_id])
    marked = _marked(rows[WARM_REQUESTS:])
    result = {
        "meta": environment(device)["date"]
        + " · "
        + (torch.cuda.get_device_name() if device.type == "cuda" else "CPU"),
        "model": args.model,
        "dry_run": args.dry_run,
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "batch_window_ms": args.batch_window_ms,
        "engine_ttft_ms": own_ttfts,
        "summary": summarize(marked, own_ttfts),
        "requests": marked,
    }
    out = Path(args.out)
    write_results(out, "ttft_path", result, markdown(result))
    print(markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main()
