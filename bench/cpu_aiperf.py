"""aiperf (NVIDIA's LLM benchmark client) against `inferq up` on this machine's CPU.

For each configuration (the CPU worker's torch threads, how many busy loops run beside it) it
starts `inferq up --device cpu --fresh` with the packaged SmolLM2 in a private data dir, starts the
busy loops, runs one `aiperf profile` (streaming chat, synthetic prompts, ignore_eos), stops
everything, and keeps aiperf's summary. Writes <name>.json (every run, with the machine, versions
and the exact commands) and <name>.md (the table).

    python -m bench.cpu_aiperf --aiperf /path/to/venv/bin/aiperf --configs default:0 \\
        --concurrency 4 --requests 40 --isl 128 --osl 32 --out bench/results/cpu --name aiperf

aiperf needs no torch but pins packages of its own: install it in its own virtual environment
(docs/clients.md). Its --tokenizer is the converted model directory under ~/.cache/inferq/models.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.report import table, write_json

REPO_ROOT = Path(__file__).resolve().parents[1]
UP_TIMEOUT_S = 600.0
METRICS = [  # aiperf summary key -> our column
    ("time_to_first_token", "ttft_ms"),
    ("inter_token_latency", "itl_ms"),
    ("request_latency", "latency_ms"),
]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _converted_tokenizer_dir() -> Path:
    found = sorted((Path.home() / ".cache" / "inferq" / "models").glob("SmolLM2-135M-Instruct*"))
    if not found:
        raise SystemExit("no converted SmolLM2 under ~/.cache/inferq/models: run `inferq up` once first")
    return found[-1]


class Up:
    """`inferq up` in the background, its output kept in a log."""

    def __init__(self, threads: str, data_dir: Path, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "worker.cli", "up", "--device", "cpu", "--port", str(self.port),
                "--data-dir", str(data_dir), "--fresh"]  # fmt: skip
        if threads != "default":
            argv += ["--cpu-threads", threads]
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_") and k != "OMP_NUM_THREADS"}
        env["PYTHONPATH"] = str(REPO_ROOT)
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "inferq is up" not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"inferq up did not come up:\n{self.log()[-3000:]}")
            time.sleep(0.5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_threads(self) -> str:
        for line in self.log().splitlines():
            if "CPU worker:" in line:
                return line.split("CPU worker: ", 1)[1]
        return "?"

    def stop(self) -> None:
        children = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                print("inferq up did not stop in 60 s: killing it", flush=True)
                self.process.kill()
                self.process.wait()
        self._log.close()
        deadline = time.monotonic() + 30
        while (left := [pid for pid in children if Path(f"/proc/{pid}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            print(f"killing pid {pid}, left by inferq up: {children[pid]}", flush=True)
            os.kill(pid, signal.SIGKILL)


def descendants(root_pid: int) -> dict[int, str]:
    """pid -> command line of every process below root_pid (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat:
            parents.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    found, todo = {}, list(parents.get(root_pid, []))
    while todo:
        pid = todo.pop()
        try:
            found[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()).strip()
        except OSError:
            continue
        todo.extend(parents.get(pid, []))
    return found


def _busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _aiperf_argv(args: argparse.Namespace, url: str, tokenizer: Path, artifact_dir: Path) -> list[str]:
    return [
        args.aiperf, "profile", "--model", "default", "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", str(tokenizer), "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
        "--isl", str(args.isl), "--isl-stddev", "0", "--osl", str(args.osl), "--osl-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--random-seed", "0", "--ui-type", "none", "--no-gpu-telemetry",
        "--no-server-metrics", "--artifact-dir", str(artifact_dir),
    ]  # fmt: skip


def _summary(export: dict) -> dict:
    row: dict = {}
    for key, name in METRICS:
        metric = export.get(key) or {}
        for stat in ("avg", "p50", "p99"):
            if metric.get(stat) is not None:
                row[f"{name}_{stat}"] = metric[stat]
    for key, name in (("output_token_throughput", "output_tok_s"), ("request_throughput", "requests_s"),
                      ("benchmark_duration", "duration_s"), ("completed_request_count", "completed"),
                      ("request_error_rate", "error_rate_pct"), ("request_count", "requests")):  # fmt: skip
        value = (export.get(key) or {}).get("avg")
        if value is not None:
            row[name] = value
    errors = export.get("error_summary") or []
    row["errors"] = int(sum(e.get("count", 0) for e in errors)) if isinstance(errors, list) else errors
    return row


def run_one(args: argparse.Namespace, threads: str, busy: int, work: Path, tokenizer: Path) -> dict:
    label = f"threads={threads} busy={busy}"
    print(f"== {label}", flush=True)
    up = Up(threads, work / "data", work / f"up-{threads}-{busy}.log")
    loops: list[subprocess.Popen] = []
    row: dict = {"threads_setting": threads, "busy_loops": busy, "worker": up.worker_threads()}
    try:
        loops = _busy_loops(busy)
        artifact_dir = work / f"aiperf-{threads}-{busy}"
        argv = _aiperf_argv(args, up.url, tokenizer, artifact_dir)
        row["command"] = shlex.join(argv)
        row["load_before"] = os.getloadavg()
        started = time.monotonic()
        # aiperf runs as several processes: its own session, so that a timeout ends all of them.
        client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            if client.wait(timeout=args.timeout_s) != 0:
                raise RuntimeError(f"aiperf exited with {client.returncode}; see {artifact_dir}/logs")
            row.update(_summary(json.loads((artifact_dir / "profile_export_aiperf.json").read_text())))
        except subprocess.TimeoutExpired:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()
            row["timed_out_s"] = args.timeout_s
        row["wall_s"] = time.monotonic() - started
        row["load_after"] = os.getloadavg()
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        up.stop()
    print(json.dumps(row), flush=True)
    return row


def _versions(aiperf: str) -> dict:
    import torch

    aiperf_version = subprocess.run([aiperf, "--version"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit.strip(), "cpu": cpu,
            "usable_cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "torch": torch.__version__, "aiperf": aiperf_version}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aiperf", required=True, help="the aiperf executable (its own venv)")
    parser.add_argument("--configs", default="default:0", help="threads:busy_loops,... (threads 'default' or N)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=32)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="a run still going then is recorded as such")
    parser.add_argument("--out", default="bench/results/cpu")
    parser.add_argument("--name", default="aiperf")
    args = parser.parse_args(argv)
    tokenizer = _converted_tokenizer_dir()
    result = {"machine": _versions(args.aiperf), "workload": {k: getattr(args, k) for k in
              ("concurrency", "requests", "isl", "osl")}, "bench_command": shlex.join(["python", "-m",
              "bench.cpu_aiperf", *(argv if argv is not None else sys.argv[1:])]), "runs": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="inferq-aiperf-") as tmp:
        for config in args.configs.split(","):
            threads, busy = config.split(":")
            result["runs"].append(run_one(args, threads, int(busy), Path(tmp), tokenizer))
    write_json(args.out, f"{args.name}.json", result)
    md = markdown(result)
    (Path(args.out) / f"{args.name}.md").write_text(md)
    print(md)


COLUMNS = [("threads_setting", "threads", ""), ("worker", "worker log", ""), ("busy_loops", "busy loops", ""),
           ("completed", "done", ".0f"), ("errors", "errors", ""), ("ttft_ms_p50", "TTFT p50 ms", ".0f"),
           ("ttft_ms_p99", "TTFT p99 ms", ".0f"), ("itl_ms_p50", "ITL p50 ms", ".1f"),
           ("itl_ms_p99", "ITL p99 ms", ".1f"), ("output_tok_s", "output tok/s", ".2f"),
           ("requests_s", "req/s", ".3f"), ("duration_s", "benchmark s", ".0f"),
           ("timed_out_s", "timed out after s", ".0f")]  # fmt: skip


def markdown(result: dict) -> str:
    """The report: machine, versions, workload, the table, and every exact command."""
    machine, workload = result["machine"], result["workload"]
    lines = [
        "# aiperf against `inferq up` on the CPU",
        "",
        f"- date: {machine['date']}; commit: `{machine['commit']}`",
        f"- CPU: {machine['cpu']}, {machine['usable_cores']} usable cores; Python {machine['python']}, "
        f"torch {machine['torch']}, aiperf {machine['aiperf']}",
        f"- model: the packaged SmolLM2-135M-Instruct (fp32 on CPU); workload: {workload['concurrency']} concurrent "
        f"streaming chats, {workload['requests']} requests, {workload['isl']}-token synthetic prompts, "
        f"{workload['osl']} tokens out (ignore_eos)",
        f"- run with: `{result['bench_command']}`",
        *([f"- note: {result['note']}"] if result.get("note") else []),
        "",
        table(result["runs"], COLUMNS, drop_absent=True),
        "",
        "Each run's aiperf command (its `--url` and `--artifact-dir` were a fresh `inferq up` and a temporary folder):",
        "",
    ]
    lines += [f"- threads {run['threads_setting']}, busy loops {run['busy_loops']}: `{run['command']}`"
              for run in result["runs"] if "command" in run]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
