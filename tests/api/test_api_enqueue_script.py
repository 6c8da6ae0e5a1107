"""A new request without an Idempotency-Key costs two Redis commands on its way in (api/submit.py):
SUBSCRIBE to its events, then one script (api/admission.py) that admits it and, only if admitted,
saves its meta and XADDs it. Checked against a real Redis: what the script leaves, what a refusal
does not leave, and, with MONITOR, the number of the commands and that the SUBSCRIBE runs before any
event is published."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

import pytest

from api.auth import key_owner
from api.request_meta import CHAT, COMPLETION, RequestMeta
from tests.api.servers import API_KEY
from tests.api.wire import (
    MODEL,
    AutoResponder,
    assert_envelope,
    chat_prompt_tokens,
    done,
    publish_model,
    stream_len,
    write_event,
)
from tests.redis_server import RedisServer
from worker.protocol import Keys, decode_request

PROMPT = {"model": MODEL, "prompt": "Hi", "max_tokens": 8}


def wait_until(condition: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class MonitorLog:
    """Every command Redis runs while in `with`, in its order (MONITOR), scripts' own commands included."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.commands: list[dict] = []
        self._marker = f"monitor-end-{secrets.token_hex(4)}"
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def __enter__(self) -> MonitorLog:
        self._thread.start()
        assert self._watching.wait(5)
        return self

    def __exit__(self, *exc_info) -> None:
        # MONITOR shows commands in the order Redis ran them: once it shows this ECHO, it showed the rest.
        with self.server.client() as client:
            client.echo(self._marker)
        self._thread.join(5)
        assert not self._thread.is_alive(), "MONITOR never showed the end marker"

    def _run(self) -> None:
        with self.server.client(decode_responses=True) as client, client.monitor() as monitor:
            self._watching.set()
            for command in monitor.listen():
                if command["command"] == f"ECHO {self._marker}":
                    return
                self.commands.append(command)


@pytest.mark.parametrize("kind", [COMPLETION, CHAT])
def test_an_accepted_request_leaves_its_meta_one_stream_entry_and_its_queue_entry(start_api, rclient, prefix, kind):
    publish_model(rclient, prefix)
    api = start_api(queue_timeout_s=120, result_ttl_s=600)
    keys = Keys(prefix)
    # Not ASCII, so the script must pass UTF-8 through untouched.
    text = "Hi ü"
    if kind == COMPLETION:
        path, body, prompt_tokens = "/v1/completions", {"prompt": text}, len(text.encode())
    else:
        messages = [{"role": "user", "content": text}]
        path, body, prompt_tokens = "/v1/chat/completions", {"messages": messages}, chat_prompt_tokens(messages)
    body = {**body, "model": MODEL, "max_tokens": 8, "temperature": 0.5, "stream": True}
    with api.client() as client, client.stream("POST", path, json=body) as response:
        assert response.status_code == 200  # the headers come once the request is enqueued
        request_id = response.headers["x-request-id"]
        meta_key = f"{prefix}:api:req:{request_id}"
        meta = RequestMeta.from_fields(rclient.hgetall(meta_key))
        assert meta == RequestMeta(
            request_id=request_id,
            owner=key_owner(API_KEY),
            kind=kind,
            model=MODEL,
            created=meta.created,
            n=1,
            include_usage=False,
            logprobs=None,
            prompt_tokens=prompt_tokens,
            result_stream=keys.result(request_id),
        )
        assert abs(meta.created - time.time()) < 10
        assert 0 < rclient.ttl(meta_key) <= 600

        entries = rclient.xrange(keys.requests)
        assert len(entries) == 1 and stream_len(rclient, prefix) == 1
        message = decode_request(entries[0][1])
        assert message.id == request_id
        if kind == COMPLETION:
            assert (message.prompt, message.messages) == (text, None)
        else:
            assert (message.prompt, message.messages) == (None, messages)
        assert message.params["max_tokens"] == 8 and message.params["temperature"] == 0.5
        assert message.deadline - message.created == pytest.approx(120)
        assert abs(message.created - time.time()) < 10

        assert rclient.zrange(f"{prefix}:api:queue", 0, -1) == [request_id]
        assert rclient.hgetall(f"{prefix}:api:queue:tokens") == {request_id: str(prompt_tokens)}
        write_event(rclient, prefix, request_id, done(1))
        assert any(line == "data: [DONE]" for line in response.iter_lines())


def test_a_refused_request_leaves_no_meta_no_stream_entry_and_no_subscription(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=1, overload_retry_after_s=2)
    keys = Keys(prefix)
    hub = api.server.config.app.state.inferq.hub

    def request_channels() -> set[str]:
        return set(rclient.pubsub_channels(f"{prefix}:events:cmpl-*"))

    with api.client() as client, client.stream("POST", "/v1/completions", json={**PROMPT, "stream": True}) as first:
        assert first.status_code == 200
        queued = first.headers["x-request-id"]
        assert request_channels() == {keys.events(queued)} and hub.channels == 1
        for _ in range(3):
            response = client.post("/v1/completions", json=PROMPT)
            error = assert_envelope(response, 503)
            assert error["code"] == "overloaded" and "1 requests are queued (limit 1)" in error["message"]
            assert response.headers["retry-after"] == "2"
        assert set(rclient.scan_iter(f"{prefix}:api:req:*")) == {f"{prefix}:api:req:{queued}"}
        assert stream_len(rclient, prefix) == 1
        assert rclient.zrange(f"{prefix}:api:queue", 0, -1) == [queued]
        # Each refused request subscribed before the script refused it; its UNSUBSCRIBE is fire-and-forget.
        assert wait_until(lambda: request_channels() == {keys.events(queued)} and hub.channels == 1), (
            request_channels(),
            hub.channels,
        )
        write_event(rclient, prefix, queued, done(1))
        assert any(line == "data: [DONE]" for line in first.iter_lines())


def test_a_new_request_costs_a_subscribe_and_one_script_before_any_event(start_api, rclient, redis_server, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    keys = Keys(prefix)
    with AutoResponder(rclient, prefix), api.client() as client:
        # A first request loads the script into Redis (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA again).
        assert client.post("/v1/completions", json=PROMPT).status_code == 200
        with MonitorLog(redis_server) as monitor:
            response = client.post("/v1/completions", json=PROMPT)
            assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    meta_key = f"{prefix}:api:req:{request_id}"
    # Every command that names the request, from the first on (the relay's commands follow the enqueue).
    mine = [(c["client_type"] == "lua", c["command"]) for c in monitor.commands if request_id in c["command"]]
    own_commands = [text for in_script, text in mine if not in_script]
    enqueue = next(i for i, text in enumerate(own_commands) if text.startswith("EVALSHA"))
    # The API sends the SUBSCRIBE first, but on its pub/sub connection, and the script on another: Redis
    # serves connections that are ready together in its own order, so either may run first. What must
    # hold: those two are the whole submit path, and the SUBSCRIBE runs before any event is published.
    submit_path = own_commands[: max(enqueue + 1, 2)]
    assert sorted(text.split(" ", 1)[0] for text in submit_path) == ["EVALSHA", "SUBSCRIBE"], submit_path
    subscribe = next(text for text in submit_path if text.startswith("SUBSCRIBE"))
    evalsha = next(text for text in submit_path if text.startswith("EVALSHA"))
    assert subscribe == f"SUBSCRIBE {keys.events(request_id)}"
    first_publish = next(i for i, (_, text) in enumerate(mine) if text.startswith("PUBLISH"))
    assert mine.index((False, subscribe)) < first_publish
    script_keys = [f"{prefix}:api:queue", f"{prefix}:api:queue:tokens", f"{prefix}:api:queue:owners", meta_key,
                   keys.requests]  # fmt: skip
    assert f" 5 {' '.join(script_keys)} " in evalsha
    # The script did the writes: none before it ran.
    script_ran = mine.index((False, evalsha))
    assert not any(in_script for in_script, _ in mine[:script_ran])
    script_writes = [text.split(" ", 2)[:2] for in_script, text in mine[script_ran:] if in_script]
    xadd_at = script_writes.index(["XADD", keys.requests])
    assert ["HSET", meta_key] in script_writes[:xadd_at] and ["EXPIRE", meta_key] in script_writes[:xadd_at]
    assert ["ZADD", f"{prefix}:api:queue"] in script_writes[:xadd_at]
    # And none of them ran as a command of its own.
    submit_writes = {("XADD", keys.requests), ("HSET", meta_key), ("EXPIRE", meta_key), ("ZADD", script_keys[0])}
    assert not [text for text in own_commands if tuple(text.split(" ", 2)[:2]) in submit_writes]
