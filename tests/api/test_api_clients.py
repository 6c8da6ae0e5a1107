"""Streams as the clients most users run read them: the openai SDK, LangChain's ChatOpenAI and LiteLLM,
side by side for over a minute, from the API with a real `python -m worker` serving the packaged SmolLM2
on CPU.

The API sends a keep-alive after 1 s of silence (INFERQ_SSE_PING_S), and the worker is paused (SIGSTOP)
for stretches of 1.5 s or more while the streams run, so every stream holds token flow and idle stretches
with keep-alives in them. A raw HTTP stream beside the clients shows where the keep-alives fell.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from api.settings import ApiSettings
from tests.api.processes import SERVED, WorkerProcess
from tests.api.servers import API_KEY, ThreadApi

# LiteLLM would fetch its model price list from GitHub when imported.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

PING_S = 1.0
MIN_STREAM_S = 60.0
MIN_PAUSE_S = 1.5  # each pause: idle for longer than the keep-alive interval
CYCLES = 12  # the worker pauses after each twelfth of the tokens
MAX_TOKENS = 200
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
# Greedy and past EOS: every client gets the same MAX_TOKENS tokens.
SAMPLING = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory):
    """A worker process and an API whose keep-alive interval is PING_S."""
    from engine.config import ModelConfig
    from engine.model_loader import resolve_model_dir

    resolve_model_dir(ModelConfig(model="default"))
    prefix = f"clients{secrets.token_hex(4)}"
    client = redis_server.client(decode_responses=True)
    # the heartbeat outlives the pauses, so the API never sees the worker as gone
    worker = WorkerProcess(
        redis_server, prefix, tmp_path_factory.mktemp("clients") / "worker.log",
        extra_args=("--heartbeat-ttl-s", "30"),
    )  # fmt: skip
    try:
        worker.wait_ready(client, prefix)
        settings = ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY], sse_ping_s=PING_S)
        api = ThreadApi(settings).start()
        try:
            yield api, worker
        finally:
            api.stop()
    finally:
        worker.stop()
        client.close()


class Stream:
    """One client's stream, read in a thread: its text, chunk count, finish reason, times, and what it raised."""

    def __init__(self, name: str, read: Callable[[Stream], None]) -> None:
        self.name = name
        self.text: list[str] = []
        self.num_chunks = 0
        self.finish_reason: str | None = None
        self.started = self.ended = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(read,), name=name, daemon=True)

    def _run(self, read: Callable[[Stream], None]) -> None:
        self.started = time.monotonic()
        try:
            read(self)
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.ended = time.monotonic()

    def add(self, text: str | None, finish_reason: str | None = None) -> None:
        self.num_chunks += 1
        self.text.append(text or "")
        self.finish_reason = finish_reason or self.finish_reason


def read_openai(url: str) -> Callable[[Stream], None]:
    def read(stream: Stream) -> None:
        import openai

        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
        chunks = client.chat.completions.create(
            model=SERVED, messages=MESSAGES, stream=True, extra_body=EXTRA, **SAMPLING
        )
        for chunk in chunks:
            choice = chunk.choices[0]
            stream.add(choice.delta.content, choice.finish_reason)

    return read


def read_langchain(url: str) -> Callable[[Stream], None]:
    def read(stream: Stream) -> None:
        from langchain_openai import ChatOpenAI

        chat = ChatOpenAI(
            model=SERVED, base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, extra_body=EXTRA, **SAMPLING
        )
        for chunk in chat.stream([(m["role"], m["content"]) for m in MESSAGES]):
            stream.add(chunk.content, chunk.response_metadata.get("finish_reason"))

    return read


def read_litellm(url: str) -> Callable[[Stream], None]:
    def read(stream: Stream) -> None:
        import litellm

        chunks = litellm.completion(
            model=f"openai/{SERVED}", api_base=f"{url}/v1", api_key=API_KEY, messages=MESSAGES, stream=True,
            extra_body=EXTRA, num_retries=0, **SAMPLING,
        )  # fmt: skip
        for chunk in chunks:
            choice = chunk.choices[0]
            stream.add(choice.delta.content, choice.finish_reason)

    return read


class RawStream(Stream):
    """The same request over plain HTTP, every line kept with its arrival time."""

    def __init__(self, url: str) -> None:
        self.lines: list[tuple[float, str]] = []
        super().__init__("raw", self._read)
        self.url = url

    def _read(self, stream: Stream) -> None:
        body = {"model": SERVED, "messages": MESSAGES, "stream": True, **EXTRA, **SAMPLING}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                self.lines.append((time.monotonic(), line))
                if line.startswith("data: {"):
                    self.num_chunks += 1

    @property
    def data_lines(self) -> int:
        return sum(line.startswith("data:") for _, line in self.lines)


def pause_worker_until_late_enough(pid: int, raw: RawStream, streams: list[Stream], pauses: list[float]) -> None:
    """Stop the worker for MIN_PAUSE_S or more after every CYCLES-th of the tokens; pause longer where the streams
    would otherwise end before MIN_STREAM_S (a faster machine), so they end a little after it."""
    end_after = time.monotonic() + MIN_STREAM_S + 2.0
    tokens_a_cycle = MAX_TOKENS // CYCLES
    while any(s.thread.is_alive() for s in streams):
        started, target = time.monotonic(), raw.num_chunks + tokens_a_cycle
        while raw.num_chunks < target and raw.thread.is_alive():
            time.sleep(0.02)
        now = time.monotonic()
        if now >= end_after or not raw.thread.is_alive():
            return
        tokens_left = MAX_TOKENS - raw.num_chunks
        run_left_s = tokens_left * (now - started) / tokens_a_cycle
        stall_needed_s = end_after - now - run_left_s
        pause = min(max(MIN_PAUSE_S, stall_needed_s / max(tokens_left / tokens_a_cycle, 1.0)), 30.0)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(pause)
        finally:
            os.kill(pid, signal.SIGCONT)
        pauses.append(pause)


@pytest.mark.timeout(480)
def test_sdk_langchain_and_litellm_stream_past_a_minute_with_idle_stretches(served):
    api, worker = served
    raw = RawStream(api.url)
    streams = [
        Stream("openai", read_openai(api.url)),
        Stream("langchain", read_langchain(api.url)),
        Stream("litellm", read_litellm(api.url)),
        raw,
    ]
    import langchain_openai  # noqa: F401 - imported before the clock starts (slow imports)
    import litellm  # noqa: F401
    import openai  # noqa: F401

    for stream in streams:
        stream.thread.start()
    pauses: list[float] = []
    pause_worker_until_late_enough(worker.process.pid, raw, streams, pauses)
    for stream in streams:
        stream.thread.join(timeout=240)
    failures = [f"{s.name} failed after {s.ended - s.started:.1f} s: {s.error!r}" for s in streams if s.error]
    assert not failures, failures
    for stream in streams:
        assert not stream.thread.is_alive(), stream.name
        assert stream.ended - stream.started >= MIN_STREAM_S, (stream.name, stream.ended - stream.started)
    clients = streams[:3]
    assert all(s.finish_reason == "length" for s in clients), [(s.name, s.finish_reason) for s in clients]
    texts = {s.name: "".join(s.text) for s in clients}
    assert len(set(texts.values())) == 1, texts  # greedy: the same tokens reached every client, none lost
    assert len(texts["openai"]) > MAX_TOKENS  # MAX_TOKENS tokens of text

    # Keep-alives fell in the silences only: each one PING_S or more after the line before it, and at least one
    # in every pause; no blank line ever followed one (a blank line would end an event).
    assert len(pauses) >= 3 and all(p >= MIN_PAUSE_S for p in pauses)
    pings = [i for i, (_, line) in enumerate(raw.lines) if line.startswith(":")]
    assert len(pings) >= len(pauses), (len(pings), pauses)
    for i in pings:
        assert raw.lines[i][1] == ": ping" and raw.lines[i + 1][1] != "", raw.lines[i - 1 : i + 2]
        assert raw.lines[i][0] - raw.lines[i - 1][0] >= PING_S * 0.9, raw.lines[i - 1 : i + 1]
    assert raw.data_lines >= MAX_TOKENS
