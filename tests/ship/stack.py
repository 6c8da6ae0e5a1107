"""Child processes of the shipping tests: `python -m worker`, `python -m api`, and process-tree checks.

Every child logs to a file (shown when it fails to start) and is stopped by its id, never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.redis_server import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """The test environment for a child: one intra-op thread (2 cores shared by several processes),
    the repo importable, no Hugging Face Hub, and none of the caller's INFERQ_* settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("INFERQ_")}
    env.update(
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO_ROOT),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.update(extra)
    return env


class Child:
    """One child process with its output in `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str], cwd: Path = REPO_ROOT) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, num_chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def start_worker(redis_url: str, prefix: str, model: str, log_path: Path, *flags: str) -> Child:
    argv = [
        sys.executable, "-m", "worker", "--model", model, "--redis-url", redis_url, "--prefix", prefix,
        "--device", "cpu", "--dtype", "float32", "--metrics-port", "0", *flags,
    ]  # fmt: skip
    return Child("worker", argv, log_path, child_env())


def start_api(redis_url: str, prefix: str, log_path: Path, **settings: str) -> tuple[Child, str]:
    """`python -m api` on a free port; returns the child and its base URL."""
    port = free_port()
    env = child_env(INFERQ_REDIS_URL=redis_url, INFERQ_PREFIX=prefix, INFERQ_HOST="127.0.0.1", INFERQ_PORT=str(port))
    env.update({f"INFERQ_{name.upper()}": value for name, value in settings.items()})
    return Child("api", [sys.executable, "-m", "api"], log_path, env), f"http://127.0.0.1:{port}"


def wait_http_ok(url: str, children: list[Child], timeout_s: float) -> None:
    """Poll `url` until it answers 200, failing early (with its log) if a child exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in children:
            child.check_alive()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    logs = "\n".join(f"--- {child.name}:\n{child.log_tail(2000)}" for child in children)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:g}s\n{logs}")


# ---- process trees (Linux /proc) ------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # NOTE: the command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has exited; only its exit status is left)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def descendants(root_pid: int) -> dict[int, str]:
    """pid -> command line of every living descendant of root_pid."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    stack = list(children.get(root_pid, []))
    while stack:
        pid = stack.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except FileNotFoundError:
            continue
        if is_running(pid):
            found[pid] = cmdline
        stack.extend(children.get(pid, []))
    return found
