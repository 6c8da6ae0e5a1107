"""Logprobs through the whole stack on the packaged SmolLM2 (byte-level BPE): a real `python -m worker`, the API,
HTTP. Every token the API shows is checked against the ids the worker wrote to the result stream, decoded by the
model's own tokenizer, and its bytes against the engine's byte table (engine/byte_level.py); an echoed prompt's
logprobs against an offline engine's prompt logprobs.
"""

from __future__ import annotations

import secrets

import pytest

from api.settings import ApiSettings
from tests.api.processes import MAX_MODEL_LEN, SERVED, WorkerProcess
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
        engine = offline_engine(model_dir)  # meanwhile the worker loads
        worker.wait_ready(client, prefix)
        api = ThreadApi(ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY])).start()
        try:
            yield {
                "api": api, "client": client, "keys": Keys(prefix), "tokenizer": tokenizer, "bytes": table.keep,
                "engine": engine,
            }  # fmt: skip
        finally:
            api.stop()
    finally:
        worker.stop()
        client.close()


def offline_engine(model_dir):
    import torch

    from tests.engine.engine_helpers import make_engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return make_engine(model_dir, max_model_len=MAX_MODEL_LEN, num_kv_tokens=2048)
    finally:
        torch.set_num_threads(threads)


def engine_prompt_logprobs(stack, prompt_ids: list[int], k: int):
    """The offline engine's prompt logprobs of a prompt (one step: the whole prompt, one token sampled)."""
    from engine.sampling_params import SamplingParams

    engine = stack["engine"]
    engine.add_request("offline", prompt_ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k))
    carried = []
    while engine.has_unfinished_requests():
        carried += [out.prompt_logprobs for out in engine.step() if out.prompt_logprobs is not None]
    (prompt,) = carried
    assert prompt.token_ids == prompt_ids
    return prompt.logprobs


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


ECHOED = "The café in 東京 serves sea urchin."


def sdk(stack):
    import openai

    return openai.OpenAI(base_url=f"{stack['api'].url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.mark.parametrize("as_token_ids", [False, True], ids=["text", "token-ids"])
def test_echo_with_max_tokens_0_returns_the_prompt_and_the_engines_logprobs(stack, as_token_ids):
    """lm-eval's log-likelihood request (echo, max_tokens 0, logprobs 1, temperature 0), through the openai SDK."""
    tokenizer = stack["tokenizer"]
    prompt_ids = tokenizer.encode(ECHOED, add_special_tokens=True)
    want = engine_prompt_logprobs(stack, prompt_ids, 1)
    answer = sdk(stack).completions.create(
        model=SERVED, prompt=prompt_ids if as_token_ids else ECHOED, echo=True, max_tokens=0, logprobs=1, temperature=0
    )
    choice = answer.choices[0]
    assert choice.text == ECHOED and choice.finish_reason == "length"
    assert answer.usage.prompt_tokens == len(prompt_ids) and answer.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert logprobs.tokens == [tokenizer.decode([t]) for t in prompt_ids]
    assert any("\ufffd" in token for token in logprobs.tokens)  # 東京's tokens hold parts of characters
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for got, top, lp in zip(logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], want, strict=True):
        assert abs(got - lp.logprob) < 1e-4
        ((best, best_lp),) = lp.top.items()
        assert list(top) == [tokenizer.decode([best])] and abs(top[tokenizer.decode([best])] - best_lp) < 1e-4
    raw = [stack["bytes"][t] for t in prompt_ids]
    assert logprobs.text_offset == [utf8_prefix_chars(b"".join(raw[:i])) for i in range(len(raw))]


def test_streamed_echo_puts_the_prompt_before_the_generated_tokens(stack):
    tokenizer = stack["tokenizer"]
    prompt_ids = tokenizer.encode(ECHOED, add_special_tokens=True)
    want = engine_prompt_logprobs(stack, prompt_ids, 2)
    chunks_ = list(
        sdk(stack).completions.create(
            model=SERVED, prompt=ECHOED, echo=True, max_tokens=4, logprobs=2, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert chunks_[0].choices[0].text.startswith(ECHOED)
    text = "".join(c.choices[0].text for c in chunks_)
    tokens = [t for c in chunks_ if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    token_logprobs = [v for c in chunks_ if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    offsets = [v for c in chunks_ if c.choices[0].logprobs for v in c.choices[0].logprobs.text_offset]
    assert text.startswith(ECHOED) and len(tokens) == len(prompt_ids) + 4
    assert tokens[: len(prompt_ids)] == [tokenizer.decode([t]) for t in prompt_ids]
    assert token_logprobs[0] is None
    assert all(abs(g - w.logprob) < 1e-4 for g, w in zip(token_logprobs[1 : len(prompt_ids)], want, strict=True))
    generated = text[len(ECHOED) :]
    assert offsets[len(prompt_ids)] == len(ECHOED) and "".join(tokens[len(prompt_ids) :]) == generated
