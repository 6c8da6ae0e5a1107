"""`inferq worker` as a process manager sees it: the PID it started is the worker (a SIGTERM to it
stops the worker and leaves nothing behind), and a CPU worker takes the torch thread count it is given
or, by default, leaves one usable core to the processes beside it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.ship.stack import Child, child_env, descendants, is_running
from tests.ship.test_inferq_up import inferq_command

THREADS_LINE = re.compile(r"CPU worker: (\d+) torch intra-op thread\(s\) on (\d+) usable core\(s\) \(([^)]*)\)")


def _inferq_worker(redis_url: str, model: Path, log_path: Path, *flags: str, env: dict[str, str]) -> Child:
    argv = [*inferq_command(), "worker", "--model", str(model), "--redis-url", redis_url,
            "--prefix", f"cmd{uuid.uuid4().hex[:8]}", "--device", "cpu", "--metrics-port", "0", *flags]  # fmt: skip
    return Child("inferq worker", argv, log_path, env)


def _wait_for(child: Child, pattern: str, timeout_s: float = 90.0) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while not (match := re.search(pattern, child.log_tail(100_000))):
        child.check_alive()
        assert time.monotonic() < deadline, child.log_tail()
        time.sleep(0.2)
    return match


def _stop(child: Child, started: dict[int, str]) -> None:
    """Teardown: stop the child, then kill by pid whatever it started that outlived it."""
    child.stop()
    for pid in [*started, *descendants(child.pid)]:
        if is_running(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)


def test_sigterm_to_the_inferq_worker_pid_stops_the_worker_and_what_it_started(
    redis_server, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    worker = _inferq_worker(redis_server.url, tiny_llama_dir, tmp_path / "worker.log", env=child_env())
    started: dict[int, str] = {}
    try:
        _wait_for(worker, r"worker \S+ serving")
        started = descendants(worker.pid)
        assert any("worker.event_publisher_process" in cmd for cmd in started.values()), started
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
        worker.process.send_signal(signal.SIGTERM)
        returncode = worker.process.wait(timeout=30)
        time.sleep(1.0)  # what the worker started exits with it (the publisher watches its parent)
        left = {pid: cmd for pid, cmd in started.items() if is_running(pid)}
        assert left == {}, f"left behind: {left}"
        assert returncode == 0 and "stopped" in worker.log_tail(), worker.log_tail()
        # The PID a user (or systemd) holds is the worker's own, not a launcher waiting on it.
        assert b"-m" in cmdline and b"worker" in cmdline and b"worker.cli" not in cmdline, cmdline
    finally:
        _stop(worker, started)


def test_a_cpu_worker_applies_cpu_threads(redis_server, tiny_llama_dir: Path, tmp_path: Path) -> None:
    worker = _inferq_worker(redis_server.url, tiny_llama_dir, tmp_path / "w.log", "--cpu-threads", "2", env=child_env())
    try:
        threads, _, source = _wait_for(worker, THREADS_LINE.pattern).groups()
        assert (int(threads), source) == (2, "INFERQ_CPU_THREADS")  # over the test env's OMP_NUM_THREADS=1
    finally:
        _stop(worker, descendants(worker.pid))


def test_a_cpu_worker_leaves_one_usable_core_by_default(redis_server, tiny_llama_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in child_env().items() if k != "OMP_NUM_THREADS"}
    torch_default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                       env=env, capture_output=True, text=True, check=True).stdout)  # fmt: skip
    worker = _inferq_worker(redis_server.url, tiny_llama_dir, tmp_path / "w.log", env=env)
    try:
        threads, cores, source = _wait_for(worker, THREADS_LINE.pattern).groups()
        usable = len(os.sched_getaffinity(0))
        assert int(cores) == usable and source == "default: cores - 1"
        assert int(threads) == max(1, min(torch_default, usable - 1)), (threads, torch_default, usable)
    finally:
        _stop(worker, descendants(worker.pid))
