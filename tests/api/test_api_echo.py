"""Completions' echo, the API's half: what the API asks the worker for, and how it shows the prompt and its
logprobs before the output, streamed and whole (events written into Redis as a worker writes them; the byte
tokenizer of tests/api/wire.py, one token a byte)."""

from __future__ import annotations

import threading

import pytest
from tokenizers import Tokenizer

from tests.api.wire import (
    MODEL,
    byte_tokenizer_json,
    chunks,
    done,
    parse_sse,
    publish_model,
    wait_for_request,
    write_event,
)
from worker.protocol import ResultEvent

BYTES = Tokenizer.from_str(byte_tokenizer_json())
PROMPT = "Hé"  # three tokens: 'H' and the two bytes of 'é'


def ids(text: str) -> list[int]:
    return BYTES.encode(text, add_special_tokens=False).ids


def prompt_logprobs(text: str) -> list[dict]:
    """The worker's prompt logprobs: the first token's null, then -1, -2, ..."""
    tokens = ids(text)
    rest = [{"token_id": t, "logprob": -float(i), "top": {str(t): -float(i)}} for i, t in enumerate(tokens[1:], 1)]
    return [{"token_id": tokens[0], "logprob": None, "top": {}}, *rest]


def output_token(seq: int, text: str, logprob: float, prompt: list[dict] | None = None) -> ResultEvent:
    (token_id,) = ids(text)
    logprobs = [{"token_id": token_id, "logprob": logprob, "top": {str(token_id): logprob}}]
    return ResultEvent(seq, "token", 0, text, [token_id], logprobs, prompt_logprobs=prompt)


def complete(start_api, rclient, prefix, body: dict, events: list[ResultEvent]):
    publish_model(rclient, prefix)
    api = start_api()

    def run() -> None:
        request_id = wait_for_request(rclient, prefix)[-1].id
        for event in events:
            write_event(rclient, prefix, request_id, event)

    threading.Thread(target=run, daemon=True).start()
    with api.client() as client:
        response = client.post("/v1/completions", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    message = wait_for_request(rclient, prefix)[-1]
    if not body.get("stream"):
        return response.json()["choices"][0], response.json()["usage"], message
    parts = [c for c in chunks(parse_sse(response.text))]
    choices = [c["choices"][0] for c in parts if c["choices"]]
    logprobs = [c["logprobs"] for c in choices if c["logprobs"]]
    joined = {
        "text": "".join(c["text"] for c in choices),
        "logprobs": {key: [v for part in logprobs for v in part[key]] for key in logprobs[0]} if logprobs else None,
        "finish_reason": choices[-1]["finish_reason"],
        "first_text": choices[0]["text"],
    }
    return joined, parts[-1].get("usage"), message


@pytest.mark.parametrize("stream", [False, True])
def test_echo_shows_the_prompt_and_its_logprobs_before_the_output(start_api, rclient, prefix, stream):
    events = [output_token(1, "o", -0.5, prompt_logprobs(PROMPT)), output_token(2, "k", -0.25), done(3, "length")]
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 2, "stream": stream}
    choice, _, message = complete(start_api, rclient, prefix, body, events)
    assert message.params["prompt_logprobs"] == 1 and message.params["max_tokens"] == 2
    assert choice["text"] == "Héok"
    assert choice["logprobs"] == {
        "tokens": ["H", "\ufffd", "\ufffd", "o", "k"],
        "token_logprobs": [None, -1.0, -2.0, -0.5, -0.25],
        "top_logprobs": [None, {"\ufffd": -1.0}, {"\ufffd": -2.0}, {"o": -0.5}, {"k": -0.25}],
        "text_offset": [0, 1, 1, 2, 3],  # both bytes of 'é' start at it
    }
    assert choice["finish_reason"] == "length"
    if stream:
        assert choice["first_text"] == "Héo"  # the prompt rides the first chunk


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_is_the_prompt_alone(start_api, rclient, prefix, stream):
    """lm-eval's log-likelihood request: the engine's one token (here an EOS: "stop") is not shown."""
    events = [output_token(1, "!", -3.0, prompt_logprobs(PROMPT)), done(2, "stop", prompt=3, completion=1)]
    options = {"stream_options": {"include_usage": True}} if stream else {}
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0, "stream": stream}
    choice, usage, message = complete(start_api, rclient, prefix, body | options, events)
    assert message.params["max_tokens"] == 1 and message.params["prompt_logprobs"] == 1
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["H", "\ufffd", "\ufffd"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.0, -2.0]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_0_without_echo_is_an_empty_completion(start_api, rclient, prefix, stream):
    """OpenAI's legacy completions: no output, finish_reason "length", no completion tokens counted."""
    events = [output_token(1, "!", -3.0), done(2, "stop", prompt=3, completion=1)]
    options = {"stream_options": {"include_usage": True}} if stream else {}
    body = {"prompt": PROMPT, "max_tokens": 0, "logprobs": 1, "temperature": 0, "stream": stream}
    choice, usage, message = complete(start_api, rclient, prefix, body | options, events)
    assert message.params["max_tokens"] == 1 and "prompt_logprobs" not in message.params
    assert choice["text"] == "" and choice["finish_reason"] == "length"
    assert not (choice["logprobs"] or {}).get("tokens")
    assert usage == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


def test_echo_of_token_ids_without_logprobs_decodes_them(start_api, rclient, prefix):
    events = [output_token(1, "o", -0.5), done(2, "length")]
    body = {"prompt": ids(PROMPT), "echo": True, "max_tokens": 1}
    choice, _, message = complete(start_api, rclient, prefix, body, events)
    assert "prompt_logprobs" not in message.params  # nothing to show: the engine computes none
    assert choice["text"] == "Héo" and choice["logprobs"] is None
