"""Logprobs through the whole stack on the packaged SmolLM2 (byte-level BPE): a real `python -m worker`, the API,
HTTP. Every token the API shows is checked against the ids the worker wrote to the result stream, decoded by the
model's own tokenizer, and its bytes against the engine's byte table (engine/byte_level.py).
"""

from __future__ import annotations

import secrets

import pytest

from api.settings import ApiSettings
from tests.api.processes import SERVED, WorkerProcess
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import chunks, parse_sse
from worker.protocol import Keys, decode_event

# Tokens that hold part of a multi-byte character ('Ġæ', 'Ŀ', '±', 'äº', '¬' are pieces of CJK characters):
# biased so that greedy picks among them, every output is made of them.
MULTI_BYTE = [17097, 247, 126, 16736, 122]
BIAS = {str(token): 100.0 for token in MULTI_BYTE}
TOP = 5


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    """A worker process, an in-process API, and the model's tokenizer and byte table."""
    from engine.byte_level import byte_level_table
    from engine.config import ModelConfig
    from engine.model_loader import resolve_model_dir
    from engine.tokenizer import load_tokenizer

    model_dir = resolve_model_dir(ModelConfig(model="default"))
    prefix = f"lp{secrets.token_hex(4)}"
    client = redis_server.client(decode_responses=True)
    worker = WorkerProcess(redis_server, prefix, tmp_path_factory.mktemp("logprobs") / "worker.log")
    tokenizer = load_tokenizer(model_dir)
    table = byte_level_table(tokenizer)
    assert table is not None, "SmolLM2's tokenizer is byte-level BPE"
    try:
        worker.wait_ready(client, prefix)
        api = ThreadApi(ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY])).start()
        try:
            yield {"api": api, "client": client, "keys": Keys(prefix), "tokenizer": tokenizer, "bytes": table.keep}
        finally:
            api.stop()
    finally:
        worker.stop()
        client.close()


def written_logprobs(stack, request_id: str) -> list[dict]:
    """The worker's own record of the request's tokens: [{token_id, logprob, top: {"id": logprob}}]."""
    events = [decode_event(fields) for _, fields in stack["client"].xrange(stack["keys"].result(request_id))]
    return [entry for e in events if e.type == "token" for entry in e.logprobs]


def decoded(stack, token_id: int | str) -> str:
    return stack["tokenizer"].decode([int(token_id)])


def ranked(top: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(top.items(), key=lambda kv: -kv[1])


def top_by_text(stack, top: dict[str, float]) -> dict[str, float]:
    """Completions' top_logprobs: text -> logprob; where two tokens decode alike, the likelier one's."""
    by_text: dict[str, float] = {}
    for token_id, logprob in ranked(top):
        by_text.setdefault(decoded(stack, token_id), logprob)
    return by_text


def utf8_prefix_chars(data: bytes) -> int:
    """Characters of the longest prefix of `data` that is whole UTF-8 (a character cut at the end not counted)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return len(data[:cut].decode("utf-8"))
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"not UTF-8: {data!r}")


def post(stack, path: str, body: dict):
    with stack["api"].client(timeout=120) as client:
        response = client.post(path, json={"model": SERVED, "temperature": 0, "logit_bias": BIAS, **body})
    assert response.status_code == 200, response.text
    return response


def test_chat_logprobs_show_decoded_tokens_and_their_raw_bytes(stack):
    body = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}
    whole = post(stack, "/v1/chat/completions", {**body, "logprobs": True, "top_logprobs": TOP})
    choice = whole.json()["choices"][0]
    written = written_logprobs(stack, whole.headers["x-request-id"])
    assert len(written) == 8
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [decoded(stack, w["token_id"]) for w in written]
    assert [c["bytes"] for c in content] == [list(stack["bytes"][w["token_id"]]) for w in written]
    assert [c["logprob"] for c in content] == [w["logprob"] for w in written]
    for c, w in zip(content, written, strict=True):
        assert [(t["token"], t["logprob"], t["bytes"]) for t in c["top_logprobs"]] == [
            (decoded(stack, t), lp, list(stack["bytes"][int(t)])) for t, lp in ranked(w["top"])
        ]
    assert any("\ufffd" in c["token"] for c in content), "some tokens hold part of a character"
    assert "Ã" not in "".join(c["token"] for c in content)  # no byte-level spelling
    joined = b"".join(bytes(c["bytes"]) for c in content)
    assert joined.decode("utf-8", "replace") == choice["message"]["content"]

    streamed = post(stack, "/v1/chat/completions", {**body, "logprobs": True, "top_logprobs": TOP, "stream": True})
    parts = [c["choices"][0]["logprobs"] for c in chunks(parse_sse(streamed.text)) if c["choices"]]
    assert [entry for part in parts if part for entry in part["content"]] == content


def test_completion_logprobs_show_decoded_tokens_and_offsets_into_the_text(stack):
    body = {"prompt": "The capital of Japan is", "max_tokens": 8, "logprobs": TOP}
    whole = post(stack, "/v1/completions", body)
    choice = whole.json()["choices"][0]
    written = written_logprobs(stack, whole.headers["x-request-id"])
    logprobs = choice["logprobs"]
    ids = [w["token_id"] for w in written]
    assert logprobs["tokens"] == [decoded(stack, t) for t in ids]
    assert logprobs["token_logprobs"] == [w["logprob"] for w in written]
    assert logprobs["top_logprobs"] == [top_by_text(stack, w["top"]) for w in written]
    raw = [stack["bytes"][t] for t in ids]
    assert logprobs["text_offset"] == [utf8_prefix_chars(b"".join(raw[:i])) for i in range(len(raw))]
    assert choice["text"] == b"".join(raw).decode("utf-8", "replace")
    assert any("\ufffd" in token for token in logprobs["tokens"])

    streamed = post(stack, "/v1/completions", {**body, "stream": True})
    parts = [c["choices"][0]["logprobs"] for c in chunks(parse_sse(streamed.text)) if c["choices"]]
    joined = {key: [v for part in parts if part for v in part[key]] for key in logprobs}
    assert joined == logprobs
