"""Pure checks of the request models against the wire contract (no server, no Redis)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.schemas import ChatCompletionRequest, CompletionRequest
from worker.protocol import SAMPLING_PARAM_FIELDS, RequestMessage, decode_request, encode_request

EVERYTHING = {
    "model": "m", "n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.1,
    "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"5": -3}, "seed": 7, "stop": ["\n\n", "END"],
    "stop_token_ids": [2], "min_tokens": 1, "ignore_eos": True, "skip_special_tokens": False, "priority": -1,
    "user": "u-1", "max_tokens": 9,
}  # fmt: skip


def test_every_sampling_field_reaches_the_worker_under_its_engine_name():
    body = ChatCompletionRequest(
        **EVERYTHING, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=3
    )
    params = body.engine_params(9, body.engine_logprobs())
    # every engine field is reachable, under its own name (prompt_logprobs through a completion's echo)
    assert set(params) == SAMPLING_PARAM_FIELDS - {"prompt_logprobs"}
    echo = CompletionRequest(**EVERYTHING | {"max_tokens": 0}, prompt="hi", echo=True, logprobs=2)
    echo_params = echo.engine_params(0, echo.engine_logprobs())
    assert echo_params["prompt_logprobs"] == 2 and echo_params["max_tokens"] == 1  # the one token is not shown
    assert set(echo_params) == SAMPLING_PARAM_FIELDS
    message = RequestMessage(id="chatcmpl-1", messages=body.wire_messages(), params=params, priority=body.priority)
    decoded = decode_request(encode_request(message))
    assert decoded.params["logit_bias"] == {5: -3}
    assert decoded.params["logprobs"] == 3 and decoded.params["stop"] == ["\n\n", "END"]
    assert decoded.priority == -1


def test_defaults_send_only_what_the_client_chose():
    body = CompletionRequest(model="m", prompt="x")
    assert body.engine_params(16, body.engine_logprobs()) == {"n": 1, "max_tokens": 16}


def test_prompt_forms():
    assert CompletionRequest(model="m", prompt="text").single_prompt() == "text"
    assert CompletionRequest(model="m", prompt=[1, 2]).single_prompt() == [1, 2]
    assert CompletionRequest(model="m", prompt=["text"]).single_prompt() == "text"
    assert CompletionRequest(model="m", prompt=[[3, 4]]).single_prompt() == [3, 4]
    with pytest.raises(ValidationError, match="send one prompt per request"):
        CompletionRequest(model="m", prompt=[[3], [4]])


def test_chat_content_parts_are_joined_and_developer_is_a_system_message():
    body = ChatCompletionRequest(
        model="m",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
    )
    assert body.wire_messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]


def test_max_completion_tokens_wins_over_max_tokens():
    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5, max_completion_tokens=7
    )
    assert body.requested_max_tokens() == 7


@pytest.mark.parametrize(
    "extra",
    [{"tool_choice": "none"}, {"response_format": {"type": "text"}}, {"modalities": ["text"]}, {"tools": []},
     {"some_future_field": 1}],
)  # fmt: skip
def test_neutral_values_of_unsupported_features_and_unknown_fields_are_accepted(extra):
    ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **extra)
