"""A bounded headless Locust run of loadtests/locustfile.py against the CPU stack: a real
redis-server, `python -m worker` on the tiny checkpoint and `python -m api`. Both user classes
run (SSE chat streams and jobs straight into Redis), with long prompts and cancelled streams in
the mix; the run must end with 0 failures and TTFT, ITL, E2E and TPS rows in Locust's CSV."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests import llm_workload
from loadtests.llm_stream import StreamTimer, chunk_content, sse_data
from tests.redis_server import RedisServer
from tests.ship.stack import REPO_ROOT, Child, child_env, start_api, start_worker, wait_http_ok

PREFIX = "load"
RUN_SECONDS = 20


@pytest.fixture(scope="module")
def cpu_stack(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RedisServer]]:
    logs = tmp_path_factory.mktemp("load-stack")
    with RedisServer() as server:
        children: list[Child] = []
        try:
            children.append(
                start_worker(
                    server.url,
                    PREFIX,
                    str(tiny_llama_dir),
                    logs / "worker.log",
                    "--max-model-len",
                    "256",
                    "--num-kv-tokens",
                    "8192",
                    "--batch-window-ms",
                    "2",
                )  # fmt: skip
            )
            api, url = start_api(server.url, PREFIX, logs / "api.log")
            children.append(api)
            wait_http_ok(f"{url}/ready", children, timeout_s=120)
            yield url, server
        finally:
            for child in reversed(children):
                child.stop()


def _stats(csv_path: Path) -> list[dict[str, str]]:
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


def test_headless_locust_run_records_llm_metrics(cpu_stack: tuple[str, RedisServer], tmp_path: Path) -> None:
    url, server = cpu_stack
    prefix = tmp_path / "run"
    argv = [
        sys.executable, "-m", "locust", "-f", str(REPO_ROOT / "loadtests" / "locustfile.py"),
        "--headless", "-u", "4", "-r", "4", "-t", f"{RUN_SECONDS}s", "--stop-timeout", "20",
        "--host", url, "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING",
        "--max-tokens", "24", "--prompt-mix", "mixed", "--long-prompt-words", "90", "--cancel-share", "0.2",
        "--redis-url", server.url, "--redis-prefix", PREFIX, "--request-timeout", "60",
    ]  # fmt: skip
    result = subprocess.run(argv, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output

    rows = _stats(Path(f"{prefix}_stats.csv"))
    total = next(r for r in rows if r["Name"] == "Aggregated")
    assert int(total["Failure Count"]) == 0, output
    assert _stats(Path(f"{prefix}_failures.csv")) == []
    counts: dict[tuple[str, str], int] = {(r["Type"], r["Name"]): int(r["Request Count"]) for r in rows}

    def recorded(kind: str, path: str) -> int:
        return sum(n for (t, name), n in counts.items() if t == kind and name.startswith(path))

    for path in ("chat [", "redis ["):
        for kind in ("TTFT", "ITL", "E2E", "TPS"):
            assert recorded(kind, path) > 0, f"no {kind} rows for {path}: {sorted(counts)}"
    assert recorded("POST", "chat [") >= recorded("E2E", "chat [")
    assert recorded("ITL", "chat [") > recorded("TTFT", "chat [")  # several gaps per stream
    assert {name for _, name in counts if name.endswith("[long]")}, "long prompts were sent"
    assert recorded("CANCEL", "chat [") + recorded("CANCEL", "redis [") > 0, "some streams were cancelled"
    tps = next(r for r in rows if r["Type"] == "TPS" and r["Name"].startswith("chat ["))
    assert float(tps["Average Response Time"]) > 1.0  # tokens/s of a stream


def test_a_load_shape_drives_the_run_and_ends_it(cpu_stack: tuple[str, RedisServer], tmp_path: Path) -> None:
    """INFERQ_LOAD_SHAPE picks a shape from llm_workload.py; it, not -t, ends the run (no -t given)."""
    url, _ = cpu_stack
    argv = [
        sys.executable, "-m", "locust", "-f", str(REPO_ROOT / "loadtests" / "locustfile.py"), "--headless",
        "--host", url, "--csv", str(tmp_path / "shape"), "--only-summary", "--loglevel", "WARNING",
        "--max-tokens", "8", "--prompt-mix", "short", "--cancel-share", "0",
        "--shape-users", "2", "--shape-seconds", "4", "--shape-spawn-rate", "2", "ChatStreamUser",
    ]  # fmt: skip
    env = child_env(INFERQ_LOAD_SHAPE="ramp")
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _stats(tmp_path / "shape_stats.csv")
    assert {r["Type"] for r in rows} >= {"POST", "TTFT", "ITL", "E2E"}
    assert all(not r["Name"].startswith("redis") for r in rows), "only the class named on the command line ran"


@pytest.mark.parametrize("name", llm_workload.SHAPE_NAMES)
def test_load_shapes(name: str) -> None:
    ticks = [llm_workload.shape_tick(name, float(second), 16, 60.0, 4.0) for second in range(61)]
    assert ticks[-1] is None, "a shape ends after shape_seconds"
    counts = [users for users, _ in ticks[:-1]]
    assert max(counts) == 16 and min(counts) >= 1
    if name == "steady":
        assert set(counts) == {16}
    elif name == "ramp":
        assert counts == sorted(counts) and counts[0] < 4
    else:  # a quarter of the users, and all of them for 5 s of every 20
        assert counts.count(16) == 15 and counts.count(4) == 45
    with pytest.raises(ValueError, match="INFERQ_LOAD_SHAPE"):
        llm_workload.shape_tick("sawtooth", 0.0, 1, 1.0, 1.0)


def test_sse_framing_and_timings() -> None:
    body = (
        b': ping\n\nid: 1\ndata: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
        b'data: {"choices": [{"delta": {"content": "lo"}}],\r\n'
        b'data:  "usage": null}\r\n\r\n'
        b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n'
    )
    events = list(sse_data(body.splitlines(keepends=True)))
    assert events[0] == '{"choices": [{"delta": {"content": "Hel"}}]}'
    assert chunk_content(events[1]) == ("lo", None, None)  # two data lines joined with "\n"
    assert chunk_content(events[2]) == ("", None, "boom")
    assert events[3] == "[DONE]"

    timer = StreamTimer(started=10.0)
    for now in (10.5, 10.6, 10.8):
        timer.token(now=now)
    assert timer.ttft_ms == pytest.approx(500)
    assert timer.gaps_ms == pytest.approx([100, 200])
    assert timer.tokens_per_s() == pytest.approx(2 / 0.3)
    assert StreamTimer(started=0.0).tokens_per_s() is None
