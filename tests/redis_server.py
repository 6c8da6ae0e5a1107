"""A private redis-server for tests: free port, temporary directory, optional AOF, restart in place.

Tests never touch a Redis they did not start (no 6379, no FLUSHALL on a shared server):
`RedisServer` owns its process and its data directory and removes both on `stop()`.

    with RedisServer(appendonly=True) as server:
        client = server.client()
        ...
        server.restart()          # same port, same data (AOF replayed)

    redis = make_redis_fixture(scope="session")       # in a conftest.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

START_TIMEOUT_S = 10.0


def find_redis_server() -> str:
    """The redis-server binary: $INFERQ_REDIS_SERVER, else the one on PATH."""
    binary = os.environ.get("INFERQ_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        raise RuntimeError("redis-server not found: put it on PATH or set INFERQ_REDIS_SERVER")
    return binary


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL redis-server if the test process dies, even by kill -9,
    so an interrupted test run never leaves a server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One redis-server process bound to 127.0.0.1 on a free port, data in a private tmp dir.

    Args:
        appendonly: turn AOF on with `appendfsync always`, so every acknowledged write survives
            a restart (even a kill -9).
        port: fixed port; a free one is picked when None.
        config_file: a redis.conf to start from (port, bind, dir and the options here override it).
        extra_args: more redis-server arguments, e.g. ["--aclfile", path].
        username / password: what `client()` and `url` authenticate with (for a server with ACL users).
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        config_file: str | Path | None = None,
        extra_args: list[str] | tuple[str, ...] = (),
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.appendonly = appendonly
        self.port = port or free_port()
        self.config_file = config_file
        self.extra_args = list(extra_args)
        self.username = username
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="inferq-redis-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f"{self.username or ''}:{self.password}@" if self.password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        auth = {"username": self.username, "password": self.password} if self.password is not None else {}
        return redis.Redis(host="127.0.0.1", port=self.port, **{**auth, **kwargs})

    def start(self) -> RedisServer:
        if self.process is not None:
            raise RuntimeError("redis-server already running")
        args = [
            find_redis_server(),
            *([str(self.config_file)] if self.config_file is not None else []),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        args += self.extra_args
        preexec = _die_with_parent if sys.platform == "linux" else None
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client(socket_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self.log_tail()}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not answer within {START_TIMEOUT_S} s: {self.log_tail()}")
                time.sleep(0.02)
        finally:
            client.close()

    def log_tail(self, num_chars: int = 2000) -> str:
        log = self.dir / "redis.log"
        return log.read_text(errors="replace")[-num_chars:] if log.exists() else ""

    def halt(self, *, hard: bool = False) -> None:
        """Stop the process but keep the data directory (for `restart`). hard=True is a kill -9."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, *, hard: bool = False, down_s: float = 0.0) -> None:
        """Stop and start again on the same port with the same data (AOF replayed when on)."""
        self.halt(hard=hard)
        time.sleep(down_s)
        self.start()

    def flush(self) -> None:
        """FLUSHALL, allowed only because this object started the server."""
        if self.process is None:
            raise RuntimeError("refusing to flush a Redis this object is not running")
        with self.client() as client:
            client.flushall()

    def stop(self) -> None:
        """Stop the process and delete the data directory."""
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def make_redis_fixture(*, scope: str = "session", appendonly: bool = False):
    """A pytest fixture that yields a started RedisServer and stops it afterwards.

    Tests sharing a session-scoped server keep apart by using their own key prefix.
    """

    @pytest.fixture(scope=scope)
    def _redis_server() -> Iterator[RedisServer]:
        with RedisServer(appendonly=appendonly) as server:
            yield server

    return _redis_server
