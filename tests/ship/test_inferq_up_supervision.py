"""`inferq up` as an operator runs it: with API keys, through a worker crash, and across restarts.

The tests share one `inferq up` with INFERQ_API_KEYS set (module scope) and run in file order; the
last ones stop it and start it again over the same data. The HOME's model cache is the session's
converted SmolLM2 (conftest's smollm2_dir), so no test here pays for the conversion.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.ship.stack import child_env, descendants, is_running
from tests.ship.test_inferq_up import UpProcess, inferq_command, start_up, stop_up
from worker.up_children import RestartBackoff

KEYS = {"INFERQ_API_KEYS": "sk-first-key, sk-second-key"}
AUTH = {"Authorization": "Bearer sk-second-key"}
START_TIMEOUT_S = 120.0  # a converted model: imports, load, start


def _home_with_converted_model(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    home = tmp_path_factory.mktemp("operator-home")
    (home / ".cache" / "inferq").mkdir(parents=True)
    (home / ".cache" / "inferq" / "models").symlink_to(smollm2_dir.parent, target_is_directory=True)
    return home


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return _home_with_converted_model(tmp_path_factory, smollm2_dir)


@pytest.fixture(scope="module")
def up_with_keys(home: Path) -> Iterator[UpProcess]:
    # Started as a script's background job is: with SIGINT ignored, which `inferq up` must still obey.
    up = start_up(home, env=KEYS, timeout_s=START_TIMEOUT_S, sigint_ignored=True)
    try:
        yield up
    finally:
        stop_up(up)


def _redis_url(up: UpProcess) -> str:
    return re.search(r"Redis: +(redis://\S+)", up.log_text()).group(1)


def _worker_pid(up: UpProcess) -> int:
    (pid,) = [
        p for p, cmd in descendants(up.process.pid).items() if " -m worker " in f"{cmd} " and "publisher" not in cmd
    ]
    return pid


def _chat(max_tokens: int, stream: bool) -> dict:
    return {"model": "default", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}  # fmt: skip


def test_restart_delays_double_up_to_a_cap_and_start_over_after_a_long_run() -> None:
    backoff = RestartBackoff(first_s=1, max_s=30, reset_after_s=60)
    assert [backoff.delay_after(run_s=5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay_after(run_s=61) == 1  # it had served a while: a fresh crash, not a crash loop
    assert backoff.delay_after(run_s=5) == 2


def test_up_with_api_keys_comes_up_serves_a_keyed_request_and_refuses_others(up_with_keys: UpProcess) -> None:
    url = f"{up_with_keys.url}/v1/chat/completions"
    reply = httpx.post(url, json=_chat(8, False), headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"].strip()
    assert httpx.post(url, json=_chat(8, False), timeout=10).status_code == 401
    wrong = httpx.post(url, json=_chat(8, False), headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    text = up_with_keys.log_text()
    probes = [line for line in text.splitlines() if '"GET /ready HTTP' in line]
    assert len(probes) == 1 and " 200 " in probes[0], probes  # with the first key, once the worker serves
    assert "API keys: on (INFERQ_API_KEYS): send 'Authorization: Bearer <key>'" in text
    assert "-H 'Authorization: Bearer <key>'" in text


def test_a_killed_worker_is_restarted_while_the_api_and_redis_stay_up(up_with_keys: UpProcess) -> None:
    api_and_redis = {
        p: c for p, c in descendants(up_with_keys.process.pid).items() if "-m api" in c or "redis-server" in c
    }
    assert len(api_and_redis) == 2, api_and_redis
    worker = _worker_pid(up_with_keys)
    ids, pieces, finish = [], [], None
    url = f"{up_with_keys.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=_chat(48, True), headers=AUTH, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("id:"):
                ids.append(int(line[3:]))
            elif line.startswith("data:") and line != "data: [DONE]":
                choice = json.loads(line[5:])["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
            if len(ids) == 3 and is_running(worker):
                subprocess.run(["kill", "-9", str(worker)], check=True)  # mid-stream
                assert httpx.get(f"{up_with_keys.url}/health", timeout=5).status_code == 200
    assert finish == "length" and ids == list(range(1, len(ids) + 1)), (ids, finish)
    assert len([p for p in pieces if p]) >= 40, pieces  # every token, though the worker died after two
    assert all(is_running(pid) for pid in api_and_redis), "the API or Redis stopped with the worker"
    text = up_with_keys.log_text()
    assert "inferq: the worker was killed by SIGKILL after" in text and "restarting it in 1s" in text
    assert "(the API and Redis stay up; its requests resume once it is back)" in text
    deadline = time.monotonic() + 60
    while "inferq: the worker is back and serving (restart 1)" not in up_with_keys.log_text():
        assert time.monotonic() < deadline, up_with_keys.log_text()[-3000:]
        time.sleep(0.25)
    assert _worker_pid(up_with_keys) != worker
    after = httpx.post(url, json=_chat(4, False), headers=AUTH, timeout=60)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4


def test_a_second_up_on_the_same_data_is_refused(up_with_keys: UpProcess, home: Path) -> None:
    argv = [*inferq_command(), "up", "--port", "1"]
    env = child_env(HOME=str(home), **KEYS)
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert second.returncode == 1
    assert f"another `inferq up` uses {home / '.cache' / 'inferq' / 'redis'}" in second.stderr


def test_pending_data_persists_across_runs_and_fresh_empties_it(up_with_keys: UpProcess, home: Path) -> None:
    marker = "inferq:test-marker"  # stands for requests left in the private Redis
    client = redis.Redis.from_url(_redis_url(up_with_keys))
    client.set(marker, "1")
    client.close()
    time.sleep(1.5)  # appendfsync everysec
    up_with_keys.process.send_signal(signal.SIGINT)  # though it was started with SIGINT ignored
    assert up_with_keys.process.wait(timeout=60) == 0, up_with_keys.log_text()[-2000:]
    assert "inferq: stopping" in up_with_keys.log_text()

    for flags, kept in (((), True), (("--fresh",), False)):
        up = start_up(home, *flags, env=KEYS, timeout_s=START_TIMEOUT_S)
        try:
            client = redis.Redis.from_url(_redis_url(up))
            assert bool(client.exists(marker)) == kept, flags
            client.close()
            text = up.log_text()
            assert ("emptied first (--fresh)" in text) == (not kept)
            assert ("the next `inferq up` finishes them" in text) == kept
        finally:
            stop_up(up)


def test_the_children_stop_when_inferq_up_itself_is_killed(home: Path) -> None:
    """A `kill -9` of `inferq up` leaves no Redis, worker or API holding the port and the data."""
    up = start_up(home, env=KEYS, timeout_s=START_TIMEOUT_S)
    try:
        assert len(up.children) == 5, up.children  # redis, worker, its publisher, api, batch worker
        up.process.kill()
        up.process.wait()
        deadline = time.monotonic() + 45
        while (left := {p: c for p, c in up.children.items() if is_running(p)}) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert left == {}, f"left behind: {left}"
    finally:
        stop_up(up)
