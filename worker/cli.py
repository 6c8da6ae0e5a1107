"""`inferq`: the one command line of the project.

    inferq up [--model default] [--port 8000]   Redis + one worker + the API on 127.0.0.1 (worker/up.py)
    inferq api                                  the API alone (python -m api; settings from INFERQ_*)
    inferq worker [flags]                       one worker (python -m worker)
    inferq generate --prompt ... [flags]        offline generation in this process (python -m engine.generate)
    inferq bench <name> [flags]                 a benchmark from bench/ (python -m bench.<name>)

Every subcommand but `up` replaces this process with its module's (exec): the PID a user or a
process manager started is the server's own, so its signals (SIGTERM from systemd, Ctrl-C)
reach the server, and nothing is left orphaned when it is stopped.

NOTE: this module imports neither torch nor the API at load time: each subcommand
runs in its own interpreter, so `inferq api` never pays for torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from worker.settings import QUANTIZATIONS

MODULES = {"api": "api", "worker": "worker", "generate": "engine.generate"}


def exec_module(module: str, argv: list[str]) -> NoReturn:
    """`python -m module argv...` in place of this process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferq", description="inferq: an OpenAI-compatible LLM service")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="Redis + one worker + the API on this machine")
    up.add_argument("--model", default="default", help="checkpoint dir, .gguf, Hub id, or 'default' (SmolLM2)")
    up.add_argument("--served-model-name", default=None)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--device", default=None, help="'auto' (default), 'cpu', 'cuda'")
    up.add_argument(
        "--cpu-threads", type=int, default=None, help="torch threads of a CPU worker (default: usable cores - 1)"
    )
    up.add_argument(
        "--quantization", default=None, choices=QUANTIZATIONS,
        help="quantize the model's linear layers at load (docs/quantization.md)",
    )  # fmt: skip
    up.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    up.add_argument(
        "--data-dir",
        default="~/.cache/inferq",
        help="where the private Redis keeps its AOF (redis/) and the Batch API its files (files/)",
    )
    up.add_argument(
        "--fresh", action="store_true", help="empty the private Redis's data first (drops requests left pending)"
    )
    for name, module in MODULES.items():
        sub.add_parser(name, help=f"python -m {module}", add_help=False)
    sub.add_parser("bench", help="python -m bench.<name> [flags]", add_help=False)

    args, rest = parser.parse_known_args(argv)
    if args.command == "up":
        if rest:
            parser.error(f"unknown arguments: {rest}")
        if args.cpu_threads is not None and args.cpu_threads < 1:
            parser.error(f"--cpu-threads must be at least 1, got {args.cpu_threads}")
        from worker.up import cmd_up

        return cmd_up(args)
    if args.command == "bench":
        if not rest:
            parser.error("inferq bench needs a benchmark name, e.g. `inferq bench kernels`")
        exec_module(f"bench.{rest[0]}", rest[1:])
    exec_module(MODULES[args.command], rest)


if __name__ == "__main__":
    raise SystemExit(main())
