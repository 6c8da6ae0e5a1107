"""Talking to the API's side of Redis the way a worker would, for tests without a real worker.

Everything here writes or reads the documented wire contract (worker/protocol/) and the
`{prefix}:tokenizer` hash, so a test that uses it is a contract test of the API side.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import redis
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from worker.protocol import (
    Keys,
    ModelInfo,
    RequestMessage,
    ResultEvent,
    WorkerHeartbeat,
    decode_request,
    encode_event,
    event_to_json,
    stream_id,
    tokenizer_fields,
)

MODEL = "tiny-test-model"
# A template in the shape of real ones; with the byte tokenizer one character is one token.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def byte_tokenizer_json() -> str:
    """A byte-level tokenizer without merges: every UTF-8 byte is one token (ids 0..255)."""
    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer.to_str()


def chat_prompt_tokens(messages: list[dict[str, str]]) -> int:
    """Prompt length of `messages` under CHAT_TEMPLATE and the byte tokenizer."""
    rendered = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
    return len(rendered.encode("utf-8"))


def publish_tokenizer(
    client: redis.Redis, prefix: str, tokenizer_json: str, chat_template: str, bos="", eos=""
) -> None:
    """What a worker writes at start (see api/tokens.py and worker.protocol.tokenizer_fields)."""
    client.hset(Keys(prefix).tokenizer, mapping=tokenizer_fields(tokenizer_json, chat_template, bos, eos))


def publish_model(
    client: redis.Redis, prefix: str, *, max_model_len: int = 64, vocab_size: int = 256, tokenizer: bool = True
) -> None:
    """Make the API believe a worker serving MODEL has started (model key, tokenizer hash)."""
    info = ModelInfo(model=MODEL, max_model_len=max_model_len, vocab_size=vocab_size, eos_token_ids=[0])
    client.set(Keys(prefix).model, info.to_json())
    if tokenizer:
        publish_tokenizer(client, prefix, byte_tokenizer_json(), CHAT_TEMPLATE)


def publish_heartbeat(client: redis.Redis, prefix: str, consumer: str = "test-worker", ttl_s: int = 30) -> None:
    beat = WorkerHeartbeat(consumer, MODEL, 64, time.time(), time.time(), running=1, waiting=2, free_kv_tokens=100)
    client.set(Keys(prefix).worker(consumer), beat.to_json(), ex=ttl_s)


def stream_len(client: redis.Redis, prefix: str) -> int:
    """Messages ever added to the request stream (XINFO's entries-added, not XLEN: workers trim
    acknowledged requests, so the stream's length can shrink while a test counts)."""
    key = Keys(prefix).requests
    if not client.exists(key):
        return 0
    return int(client.xinfo_stream(key)["entries-added"])


def queued_requests(client: redis.Redis, prefix: str) -> list[RequestMessage]:
    return [decode_request(fields) for _, fields in client.xrange(Keys(prefix).requests)]


def wait_for_request(client: redis.Redis, prefix: str, count: int = 1, timeout_s: float = 5.0) -> list[RequestMessage]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        messages = queued_requests(client, prefix)
        if len(messages) >= count:
            return messages
        time.sleep(0.01)
    raise AssertionError(f"expected {count} request(s) on the stream within {timeout_s} s")


def write_event(client: redis.Redis, prefix: str, request_id: str, event: ResultEvent, *, publish: bool = True) -> None:
    """Write one event as a worker does: the result stream first (explicit id), then pub/sub."""
    keys = Keys(prefix)
    client.xadd(keys.result(request_id), encode_event(event), id=stream_id(event.seq))
    if publish:
        client.publish(keys.events(request_id), event_to_json(event))


def token(seq: int, text: str, index: int = 0, token_ids: list[int] | None = None, logprobs=None) -> ResultEvent:
    ids = token_ids if token_ids is not None else [ord(c) % 256 for c in text] or [1]
    return ResultEvent(seq=seq, type="token", index=index, text=text, token_ids=ids, logprobs=logprobs)


def done(seq: int, reason: str = "stop", index: int = 0, prompt: int = 5, completion: int = 3) -> ResultEvent:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return ResultEvent(seq=seq, type="done", index=index, finish_reason=reason, usage=usage)


def parse_sse(text: str) -> list[dict[str, str]]:
    """SSE events of a body: each a dict with 'data' and, when present, 'id' (comments dropped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[name] = event[name] + "\n" + value if name in event else value
        if "data" in event:
            events.append(event)
    return events


def chunks(events: list[dict[str, str]]) -> list[dict]:
    return [json.loads(e["data"]) for e in events if e["data"] != "[DONE]"]


def assert_envelope(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


class AutoResponder:
    """Answers every request that arrives on the stream with one token event ("ok") and a done
    event per choice, as a very fast worker that says little would; a thread, while in `with`."""

    def __init__(self, client: redis.Redis, prefix: str, text: str = "ok") -> None:
        self.client = client
        self.prefix = prefix
        self.text = text
        self.answered: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auto-responder", daemon=True)

    def __enter__(self) -> AutoResponder:
        # NOTE: the stream's newest entry is read here, not in the thread: a request the test sends right after
        # `with` could otherwise reach the stream before the thread first ran and be taken for an old one
        # (seen once in CI: test_a_started_request_leaves_the_queue waited for an answer that never came).
        newest = self.client.xrevrange(Keys(self.prefix).requests, count=1)
        self._last = newest[0][0] if newest else "0-0"  # answer only what arrives from now on
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        keys = Keys(self.prefix)
        last = self._last
        while not self._stop.is_set():
            reply = self.client.xread({keys.requests: last}, block=50, count=100)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    message = decode_request(fields)
                    n = int(message.params.get("n", 1))
                    seq = 0
                    for index in range(n):
                        seq += 1
                        write_event(self.client, self.prefix, message.id, token(seq, self.text, index=index))
                        seq += 1
                        write_event(self.client, self.prefix, message.id, done(seq, index=index))
                    self.answered.append(message.id)
