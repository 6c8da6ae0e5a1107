"""`inferq up` from a clean state: the one-command local stack serves the embedded SmolLM2 to the
`openai` SDK and to the chat page in headless Chromium, then stops on Ctrl-C leaving no process.

The tests share one `inferq up` (module scope) and run in file order; the last one stops it.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from openai import OpenAI

from tests.redis_server import free_port
from tests.ship.chromium import HeadlessChromium
from tests.ship.stack import REPO_ROOT, child_env, descendants, is_running

ARTIFACTS = REPO_ROOT / "artifacts" / "ship"
READY_TIMEOUT_S = 240.0  # converts the packaged GGUF into an empty HOME, then loads it


def inferq_command() -> list[str]:
    """The `inferq` console script of this environment (pip install -e .), else its module."""
    script = Path(sys.executable).parent / "inferq"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "worker.cli"]


@dataclass
class UpProcess:
    process: subprocess.Popen
    url: str
    log_path: Path
    children: dict[int, str] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_up(
    home: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    sigint_ignored: bool = False,
) -> UpProcess:
    """`inferq up` with HOME=home (and `env`) on a free port, once it says it is up (its children recorded).

    sigint_ignored: start it as a shell starts a background job (`inferq up &` in a script).
    """
    port = free_port()
    log_path = home / f"inferq-up-{port}.log"
    argv = [*inferq_command(), "up", "--model", "default", "--device", "cpu", "--port", str(port), *flags]
    env = child_env(HOME=str(home), **(env or {}))
    preexec = _ignore_sigint if sigint_ignored else None
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec)
    up = UpProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout_s
    while "inferq is up" not in up.log_text():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_up(up)
            raise RuntimeError(f"inferq up did not come up:\n{up.log_text()[-4000:]}")
        time.sleep(0.25)
    up.children = descendants(process.pid)
    return up


def stop_up(up: UpProcess) -> None:
    """Teardown after a failed test: stop `inferq up`, then kill whatever it left (by pid)."""
    if up.process.poll() is None:
        up.process.send_signal(signal.SIGINT)
        try:
            up.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.process.kill()
            up.process.wait()
    for pid in up.children or descendants(up.process.pid):
        if is_running(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)


@pytest.fixture(scope="module")
def inferq_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    home = tmp_path_factory.mktemp("clean-home")  # no converted model, no Redis data: a first run
    up = start_up(home)
    try:
        yield up
    finally:
        stop_up(up)


def test_up_starts_redis_a_worker_and_the_api_and_says_how_to_call_it(inferq_up: UpProcess) -> None:
    def kind(cmd: str) -> str:
        if "redis-server" in cmd:
            return "redis"
        if "-m worker.event_publisher_process" in cmd:  # the worker's event writer (INFERQ_PUBLISHER_PROCESS)
            return "publisher"
        if "-m batch" in cmd:
            return "batch"
        return "worker" if "-m worker" in cmd else "api" if "-m api" in cmd else cmd

    kinds = sorted(kind(cmd) for cmd in inferq_up.children.values())
    assert kinds == ["api", "batch", "publisher", "redis", "worker"], inferq_up.children
    text = inferq_up.log_text()
    assert f"inferq is up: {inferq_up.url}" in text
    assert f"curl {inferq_up.url}/v1/chat/completions" in text
    assert "from openai import OpenAI" in text
    # From a clean HOME the packaged model was converted into it (the worker's cache), not found elsewhere.
    home = inferq_up.log_path.parent
    assert list((home / ".cache" / "inferq" / "models").glob("SmolLM2-135M-Instruct*")), "no conversion in HOME"
    assert list((home / ".cache" / "inferq" / "redis").glob("appendonly*")), "the private Redis keeps its AOF"


def test_the_wait_for_readiness_is_quiet_and_the_conversion_shows_its_progress(inferq_up: UpProcess) -> None:
    text = inferq_up.log_text()
    # The worker's heartbeat in Redis says when it serves; then one GET /ready checks the API.
    probes = [line for line in text.splitlines() if re.search(r'"GET /(ready|health) HTTP', line)]
    assert len(probes) == 1 and " 200 " in probes[0], probes
    assert "a first start converts the packaged model" in text and "(a progress bar follows)" in text
    assert re.search(r"Converting SmolLM2-135M-Instruct\.Q4_1\.gguf: 100%\|", text), text[-3000:]


def test_the_banner_gives_the_private_redis_url_and_says_what_persists(inferq_up: UpProcess) -> None:
    text = inferq_up.log_text()
    match = re.search(r"Redis: +(redis://127\.0\.0\.1:\d+/0) ", text)
    assert match, text[-3000:]
    url = match.group(1)
    assert f"export INFERQ_REDIS_URL={url}" in text
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert client.ping()
        assert client.keys("inferq:worker:*"), "the printed Redis is not the one the worker serves from"
    finally:
        client.close()
    data_dir = inferq_up.log_path.parent / ".cache" / "inferq" / "redis"
    assert f"Data:     {data_dir} keeps the requests still queued or running when inferq stops" in text
    assert "the next `inferq up` finishes them (`inferq up --fresh` empties it)" in text
    assert "Worker:   restarted with back-off (1, 2, 4 ... 30 s) if it exits; the API and Redis stay up" in text
    assert "API keys" not in text  # auth is off


def test_a_job_put_into_the_printed_redis_url_is_answered(inferq_up: UpProcess) -> None:
    """The README's submission through Redis, with the URL the banner printed."""
    url = re.search(r"Redis: +(redis://\S+)", inferq_up.log_text()).group(1)
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        job = f"job-{uuid.uuid4().hex[:8]}"
        r.xadd("inferq:requests", {"v": "1", "id": job, "prompt": "Once upon a time",
                                   "params": json.dumps({"max_tokens": 8, "temperature": 0})})  # fmt: skip
        last, events = "0-0", []
        deadline = time.monotonic() + 60
        while not events or events[-1]["type"] not in ("done", "error"):
            assert time.monotonic() < deadline, events
            for _, entries in r.xread({f"inferq:result:{job}": last}, block=1000) or []:
                for entry_id, event in entries:
                    events.append(event)
                    last = entry_id
        assert events[-1]["type"] == "done", events[-1]
        assert "".join(e.get("text", "") for e in events).strip()
    finally:
        r.close()


def test_openai_sdk_gets_a_real_answer(inferq_up: UpProcess) -> None:
    client = OpenAI(base_url=f"{inferq_up.url}/v1", api_key="none", timeout=60, max_retries=0)
    (model,) = [m.id for m in client.models.list().data]
    assert model == "default"
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    answer = reply.choices[0].message.content
    assert "Paris" in answer, answer
    assert reply.usage.completion_tokens > 0 and reply.choices[0].finish_reason in ("stop", "length")

    streamed = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three primary colors."}],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices]
    assert len([p for p in pieces if p]) > 3 and re.search(r"[A-Za-z]{3}", "".join(pieces))


def test_web_page_streams_an_answer_in_headless_chromium(inferq_up: UpProcess, tmp_path: Path) -> None:
    page_html = httpx.get(f"{inferq_up.url}/", timeout=10)
    assert page_html.status_code == 200 and "text/html" in page_html.headers["content-type"]
    profile = tmp_path / "profile"
    profile.mkdir()
    browser = HeadlessChromium(profile)
    try:
        page = browser.open(f"{inferq_up.url}/")
        page.wait_for("document.getElementById('model')?.options.length > 0", 30)
        assert page.evaluate("document.getElementById('model').value") == "default"
        page.evaluate("document.getElementById('max-tokens').value = '48'")
        page.evaluate("document.getElementById('temperature').value = '0'")  # greedy: a known answer
        page.evaluate("document.getElementById('prompt').focus()")
        # Record every text the answer bubble shows, as the DOM changes (each SSE chunk replaces it).
        page.evaluate(
            "window.seen = []; new MutationObserver((records) => records.forEach((r) => r.addedNodes.forEach("
            "(n) => n.nodeType === Node.TEXT_NODE && window.seen.push(n.data)))).observe("
            "document.getElementById('log'), {childList: true, subtree: true})"
        )
        page.type_text("What is the capital of France?")
        page.press_enter()
        bubble = "document.querySelector('.message.assistant')"
        state = page.wait_for(f"(() => {{ const s = {bubble}?.dataset.state; return s !== 'streaming' && s; }})()", 60)
        assert state == "done", page.evaluate("document.body.innerText")
        seen = [text for text in page.evaluate("window.seen") if text]
        assert len(seen) >= 3, f"the answer did not stream: {seen}"
        assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:])), seen

        answer = page.evaluate(f"{bubble}.firstChild.textContent")
        assert "Paris" in answer, answer
        assert page.evaluate("document.querySelector('.message.user').textContent") == "What is the capital of France?"
        stats = page.evaluate("(({textContent, dataset}) => ({text: textContent, ...dataset}))"
                              "(document.getElementById('stats'))")  # fmt: skip
        assert re.search(r"\d+ tokens · [\d.]+ tok/s · first token \d+ ms", stats["text"]), stats
        assert int(stats["tokens"]) > 1 and float(stats["tps"]) > 0
        png = page.screenshot(ARTIFACTS / "web-page.png")
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
        shutil.copy(ARTIFACTS / "web-page.png", tmp_path / "web-page.png")
        page.close()
    finally:
        browser.stop()


def test_ctrl_c_stops_everything(inferq_up: UpProcess) -> None:
    assert inferq_up.children and all(is_running(pid) for pid in inferq_up.children)
    inferq_up.process.send_signal(signal.SIGINT)
    assert inferq_up.process.wait(timeout=60) == 0, inferq_up.log_text()[-3000:]
    left = {pid: cmd for pid, cmd in inferq_up.children.items() if is_running(pid)}
    assert left == {}, f"left behind: {left}"
    port = int(inferq_up.url.rsplit(":", 1)[1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the API port still answers"
    assert "inferq: stopping" in inferq_up.log_text()


def test_a_second_signal_while_stopping_kills_the_children_instead_of_abandoning_them(
    inferq_up: UpProcess,
) -> None:
    """The impatient double Ctrl-C: the children run in their own sessions, so `inferq up` must end them."""
    assert inferq_up.process.poll() is not None, "runs after test_ctrl_c_stops_everything"
    up = start_up(inferq_up.log_path.parent, "--served-model-name", "smollm2")  # the converted model is reused
    try:
        assert [m["id"] for m in httpx.get(f"{up.url}/v1/models", timeout=10).json()["data"]] == ["smollm2"]
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 2000, "ignore_eos": True, "stream": True}  # fmt: skip
        # A long generation in flight: the API and the worker would each take seconds to drain it.
        with httpx.stream("POST", f"{up.url}/v1/chat/completions", json=body, timeout=30) as response:
            assert response.status_code == 200
            next(response.iter_lines())
            up.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            up.process.send_signal(signal.SIGTERM)
            up.process.wait(timeout=30)
        left = {pid: cmd for pid, cmd in up.children.items() if is_running(pid)}
        assert left == {}, f"left behind: {left}"
    finally:
        stop_up(up)
