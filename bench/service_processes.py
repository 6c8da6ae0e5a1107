"""The service benchmark's processes: redis-server, the worker and the API as children of the
benchmark, their CPU time, and the optional py-spy sampler of the worker (bench/service_overhead.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

STEM = "service_overhead"  # every file the service benchmark writes starts with this


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_server_binary() -> str:
    server = os.environ.get("INFERQ_REDIS_SERVER") or shutil.which("redis-server")
    if not server:
        raise SystemExit("no redis-server: put one on PATH or set INFERQ_REDIS_SERVER")
    return server


def redis_server_libraries() -> dict[str, str]:
    """The environment a carried redis-server needs for its shared libraries (INFERQ_REDIS_LIB, set by the
    bench/run_gpu_*.sh scripts when the binary does not run as it is), for redis-server alone; {} otherwise."""
    lib = os.environ.get("INFERQ_REDIS_LIB")
    return {"LD_LIBRARY_PATH": lib} if lib else {}


@contextlib.contextmanager
def private_redis(*server_args: str) -> Iterator[str]:
    """A throwaway redis-server (no persistence unless server_args ask for it) on a free port; yields its URL
    once it answers, stops it on the way out."""
    import redis

    port, data_dir = free_port(), tempfile.mkdtemp(prefix="inferq-bench-redis-")
    server = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir,
                               "--save", "", "--appendonly", "no", *server_args],
                              stdout=subprocess.DEVNULL, env={**os.environ, **redis_server_libraries()})  # fmt: skip
    try:
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Service:
    """redis-server, the worker and the API as child processes; stopped in reverse order. Each writes
    its log into `out` as {stem}_{name}.log."""

    def __init__(self, out: Path, stem: str = STEM) -> None:
        self.out, self.stem, self.procs, self.logs = out, stem, {}, []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.out / f"{self.stem}_{name}.log", "wb")  # noqa: SIM115 (closed in stop)
        self.logs.append(log)
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} (see {self.stem}_{name}.log)")

    def wait_ready(self, base: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            try:
                with urllib.request.urlopen(f"{base}/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the service was not ready after {timeout_s:.0f}s")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in self.logs:
            log.close()


def start_profiler(pid: int, out: Path) -> subprocess.Popen | None:
    """With BENCH_PYSPY=1 and py-spy on PATH: sample the worker's Python stacks (threads, only those
    holding the GIL, without pausing it) during the throughput run, into {STEM}_worker_pyspy.txt
    (py-spy's raw format: one 'stack count' line per distinct stack)."""
    if os.environ.get("BENCH_PYSPY") != "1" or not shutil.which("py-spy"):
        return None
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--threads", "--gil", "--nonblocking",
                             "--rate", "200", "--format", "raw", "--output", str(out / f"{STEM}_worker_pyspy.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip


def stop_profiler(profiler: subprocess.Popen | None) -> None:
    if profiler is None:
        return
    profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        profiler.wait(timeout=30)
    except subprocess.TimeoutExpired:
        profiler.kill()


def read_when_written(path: Path, timeout_s: float) -> dict | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):  # not there yet, or half written
            time.sleep(0.1)
            continue
        path.unlink()
        return result
    return None


def worker_cpu_split(num_physical: int = 2) -> tuple[set[int], set[int]] | None:
    """(the worker's CPUs, everyone else's): the logical CPUs of the first `num_physical` physical
    cores (SMT siblings together, from /sys topology) for the worker, the rest for redis, the API
    processes and the load-generating clients. None where the machine has too few CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    cores: dict[str, list[int]] = {}
    for cpu in allowed:
        cores.setdefault(_core_of(cpu), []).append(cpu)
    worker = {cpu for cpus in list(cores.values())[:num_physical] for cpu in cpus}
    rest = set(allowed) - worker
    return (worker, rest) if len(rest) >= 4 else None


def _core_of(cpu: int) -> str:
    """A physical core's identity: its SMT sibling list (the CPU itself where /sys does not say)."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    return path.read_text().strip() if path.exists() else str(cpu)
