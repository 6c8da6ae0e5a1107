"""The child processes of `inferq up`: started in order, stopped in reverse, and the worker
restarted with back-off when it exits while the API and Redis stay up.

Each child leads its own process group (start_new_session): a Ctrl-C in the terminal reaches
only `inferq up`, which then stops the children in order, gracefully; and a group kill also
ends what a child started (the worker's event publisher process).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def say(message: str) -> None:
    """One line of `inferq up`'s own log (stderr, beside its children's logs)."""
    print(f"inferq: {message}", file=sys.stderr, flush=True)


def _die_with(parent: int) -> None:
    """In a child before its exec: SIGTERM when `inferq up` dies, even by SIGKILL (Linux), so that no
    Redis, worker or API outlives it holding its port and data."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the prctl
            os._exit(1)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class Stack:
    """The children by name, in start order (a restarted child keeps its place)."""

    def __init__(self) -> None:
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        parent = os.getpid()
        proc = subprocess.Popen(
            argv, env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=lambda: _die_with(parent)
        )
        self.children[name] = proc
        return proc

    def check_alive(self, *names: str) -> None:
        """RuntimeError naming the first of `names` that exited."""
        for name in names:
            proc = self.children.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} {describe_exit(proc.returncode)}")

    def kill_group(self, name: str) -> None:
        """SIGKILL what is left of an exited child's process group (its own children)."""
        with contextlib.suppress(ProcessLookupError, KeyError):
            os.killpg(self.children[name].pid, signal.SIGKILL)

    def stop(self, grace_s: float = 20.0) -> None:
        for name, proc in reversed(self.children.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    say(f"{name} did not stop in {grace_s:.0f}s, killing it")
                    proc.kill()
                    proc.wait()
            self.kill_group(name)  # what it left behind (a publisher whose worker died at once)
        self.children.clear()

    def kill(self) -> None:
        """SIGKILL every child and what it started (a second Ctrl-C: stop waiting for them).

        No waiting here: this runs in a signal handler, possibly inside stop()'s Popen.wait,
        whose lock a nested wait could deadlock on; stop() reaps.
        """
        for proc in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class RestartBackoff:
    """Delays before restarting a worker that exited: first_s, doubling up to max_s; a worker
    that had run reset_after_s or longer starts the sequence again (one crash after hours of
    service restarts at once; a worker crashing on every start is retried ever more slowly)."""

    first_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0
    _next_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._next_s = self.first_s

    def delay_after(self, run_s: float) -> float:
        """The delay before the next start of a worker that ran run_s seconds."""
        if run_s >= self.reset_after_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(self.max_s, self._next_s * 2)
        return delay


class WorkerSupervisor:
    """Keeps one worker running under `stack`'s name "worker".

    Args:
        stack: the children.
        argv, env: how to start the worker.
        is_serving: whether the worker started at the given wall-clock time (or later) serves
            (its heartbeat says so); quiet: it reads Redis, nothing logs it.
        backoff: restart delays.
    """

    NAME = "worker"

    def __init__(
        self,
        stack: Stack,
        argv: list[str],
        env: dict[str, str],
        is_serving: Callable[[float], bool],
        backoff: RestartBackoff | None = None,
    ) -> None:
        self.stack = stack
        self.argv = argv
        self.env = env
        self.is_serving = is_serving
        self.backoff = backoff or RestartBackoff()
        self.num_restarts = 0
        self._started_at = 0.0  # monotonic
        self._started_wall = 0.0
        self._restart_at: float | None = None
        self._awaiting_back = False

    def start(self) -> None:
        self._started_at, self._started_wall = time.monotonic(), time.time()
        self.stack.start(self.NAME, self.argv, self.env)

    def serving(self) -> bool:
        """The current worker process serves (its heartbeat is newer than its start)."""
        return self.is_serving(self._started_wall)

    def exited(self) -> int | None:
        return self.stack.children[self.NAME].poll()

    def poll(self) -> None:
        """One look: notice an exit, restart when its delay is over, say when it serves again."""
        now = time.monotonic()
        if self._restart_at is None:
            returncode = self.exited()
            if returncode is not None:
                run_s = now - self._started_at
                delay = self.backoff.delay_after(run_s)
                self.stack.kill_group(self.NAME)
                say(
                    f"the worker {describe_exit(returncode)} after {run_s:.0f}s; restarting it in {delay:.0f}s "
                    "(the API and Redis stay up; its requests resume once it is back)"
                )
                self._restart_at = now + delay
                self._awaiting_back = False
            elif self._awaiting_back and self.serving():
                say(f"the worker is back and serving (restart {self.num_restarts})")
                self._awaiting_back = False
        elif now >= self._restart_at:
            self._restart_at = None
            self.num_restarts += 1
            say(f"restarting the worker (restart {self.num_restarts})")
            self.start()
            self._awaiting_back = True
