"""A chat request that sets no max_tokens gets the operator's default, else the model's own (the
workers publish it in ModelInfo, from generation_config.json), always within the context room."""

from __future__ import annotations

import pytest

from tests.api.wire import MODEL, chat_prompt_tokens, publish_model, wait_for_request
from worker.protocol import Keys, ModelInfo

CONTEXT = 64
MESSAGES = [{"role": "user", "content": "Hi"}]


def publish_default(rclient, prefix: str, default_max_tokens: int | None) -> None:
    """What a worker whose model has (or lacks) generation_config's max_new_tokens publishes."""
    publish_model(rclient, prefix, max_model_len=CONTEXT)
    info = ModelInfo(MODEL, CONTEXT, 256, [0], default_max_tokens=default_max_tokens)
    rclient.set(Keys(prefix).model, info.to_json())


def enqueued_max_tokens(api, rclient, prefix: str, body: dict) -> int:
    with api.client() as client, client.stream("POST", body.pop("url"), json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return wait_for_request(rclient, prefix)[-1].params["max_tokens"]


@pytest.mark.parametrize(
    ("model_default", "operator_default", "body", "expected"),
    [
        (20, None, {}, 20),  # the model's default
        (None, None, {}, CONTEXT - chat_prompt_tokens(MESSAGES)),  # none: up to the context, as vLLM
        (20, 7, {}, 7),  # INFERQ_DEFAULT_MAX_TOKENS wins over the model's
        (20, None, {"max_tokens": 30}, 30),  # the client's choice is not capped by the model's default
        (500, None, {}, CONTEXT - chat_prompt_tokens(MESSAGES)),  # never past the context room
    ],
)
def test_chat_default_max_tokens(start_api, rclient, prefix, model_default, operator_default, body, expected) -> None:
    publish_default(rclient, prefix, model_default)
    api = start_api(default_max_tokens=operator_default)
    request = {"url": "/v1/chat/completions", "model": MODEL, "messages": MESSAGES, **body}
    assert enqueued_max_tokens(api, rclient, prefix, request) == expected


def test_completions_keep_their_own_default(start_api, rclient, prefix) -> None:
    publish_default(rclient, prefix, 20)
    api = start_api()
    request = {"url": "/v1/completions", "model": MODEL, "prompt": "abc"}
    assert enqueued_max_tokens(api, rclient, prefix, request) == 16


def test_an_older_model_record_without_the_field_reads_as_none() -> None:
    old = '{"model": "m", "max_model_len": 64, "vocab_size": 256, "eos_token_ids": [0]}'
    assert ModelInfo.from_json(old).default_max_tokens is None
