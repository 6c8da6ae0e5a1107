"""Bad input: each answered with its status and an OpenAI-format error, and nothing enqueued.

The model key and tokenizer are published as a worker would (context 64 tokens, byte tokenizer:
one character is one token), no worker runs, and the request stream must stay empty.
"""

from __future__ import annotations

import secrets

import pytest

from api.settings import ApiSettings
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import MODEL, assert_envelope, chat_prompt_tokens, publish_model, stream_len

MSG = [{"role": "user", "content": "Hi"}]
CONTEXT = 64


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": MSG, **fields}


def comp(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hi", **fields}


CHAT_URL, COMP_URL = "/v1/chat/completions", "/v1/completions"
LONG = "x" * CONTEXT  # 64 characters = 64 tokens of prompt, the whole context

# (id, url, json body, status, expected param, text the message must contain)
CASES = [
    ("wrong-type-messages", CHAT_URL, chat(messages="hi"), 400, "messages", "valid list"),
    ("wrong-type-max-tokens", CHAT_URL, chat(max_tokens="8"), 400, "max_tokens", "integer"),
    ("bool-as-int", CHAT_URL, chat(n=True), 400, "n", "integer"),
    ("temperature-negative", CHAT_URL, chat(temperature=-1), 400, "temperature", "greater than or equal to 0"),
    ("temperature-string", CHAT_URL, chat(temperature="hot"), 400, "temperature", "number"),
    ("temperature-numeric-string", COMP_URL, comp(temperature="0.5"), 400, "temperature", "number"),
    ("top-p-zero", COMP_URL, comp(top_p=0), 400, "top_p", "greater than 0"),
    ("n-too-large", CHAT_URL, chat(n=17), 400, "n", "16"),
    ("stop-100-strings", CHAT_URL, chat(stop=["s"] * 100), 400, "stop", "16"),
    ("stop-too-long", CHAT_URL, chat(stop=["s" * 300]), 400, "stop[0]", "256"),
    ("logprobs-too-many", COMP_URL, comp(logprobs=21), 400, "logprobs", "20"),
    ("top-logprobs-too-many", CHAT_URL, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs", "20"),
    ("top-logprobs-without-logprobs", CHAT_URL, chat(top_logprobs=2), 400, "top_logprobs", "logprobs"),
    ("max-tokens-negative", COMP_URL, comp(max_tokens=-1), 400, "max_tokens", "greater than or equal to 0"),
    ("max-tokens-negative-echo", COMP_URL, comp(max_tokens=-1, echo=True), 400, "max_tokens",
     "greater than or equal to 0"),
    ("chat-max-tokens-zero", CHAT_URL, chat(max_tokens=0), 400, "max_tokens", "greater than or equal to 1"),
    ("max-tokens-over-context", COMP_URL, comp(max_tokens=CONTEXT), 400, "max_tokens", f"is {CONTEXT}"),
    ("max-tokens-plus-prompt-over-context", COMP_URL, comp(prompt="abcd", max_tokens=CONTEXT - 2), 400,
     "max_tokens", f"{CONTEXT + 2} were requested (4 in the prompt, {CONTEXT - 2} in max_tokens)"),
    ("max-completion-tokens-over-context", CHAT_URL, chat(max_completion_tokens=10_000), 400,
     "max_completion_tokens", f"{CONTEXT}"),
    ("prompt-over-context", COMP_URL, comp(prompt=LONG), 400, "prompt", f"is {CONTEXT} tokens, but this model's "
     f"context (max_model_len) is {CONTEXT}"),
    ("chat-prompt-over-context", CHAT_URL, chat(messages=[{"role": "user", "content": LONG}]), 400, "messages",
     f"is {chat_prompt_tokens([{'role': 'user', 'content': LONG}])} tokens"),
    ("token-prompt-over-context", COMP_URL, comp(prompt=[1] * CONTEXT), 400, "prompt", f"is {CONTEXT} tokens"),
    ("token-id-outside-vocab", COMP_URL, comp(prompt=[1, 5, 256, 300]), 400, "prompt",
     "prompt[2] = 256 is outside the vocabulary [0, 256)"),
    ("negative-token-id", COMP_URL, comp(prompt=[1, -1]), 400, "prompt[1]", "greater than or equal to 0"),
    ("several-prompts", COMP_URL, comp(prompt=["a", "b"]), 400, "prompt", "one prompt per request"),
    ("empty-prompt", COMP_URL, comp(prompt=""), 400, "prompt", "at least 1"),
    ("empty-messages", CHAT_URL, chat(messages=[]), 400, "messages", "at least 1"),
    ("bad-role", CHAT_URL, chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role", "'user'"),
    ("function-role", CHAT_URL, chat(messages=[{"role": "function", "content": "x"}]), 400, "messages[0].role",
     "not supported"),
    ("image-part", CHAT_URL, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages[0].content", "'image_url'"),
    ("tools-on-completions", COMP_URL, comp(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools",
     "not supported"),
    ("response-format-xml", CHAT_URL, chat(response_format={"type": "xml"}), 400, "response_format.type",
     "'json_schema'"),
    ("suffix", COMP_URL, comp(suffix="end"), 400, "suffix", "not supported"),
    ("best-of", COMP_URL, comp(best_of=3), 400, "best_of", "must equal n"),
    ("stream-options-without-stream", CHAT_URL, chat(stream_options={"include_usage": True}), 400,
     "stream_options", "stream is true"),
    ("logit-bias-key", CHAT_URL, chat(logit_bias={"abc": 1}), 400, "logit_bias", "token ids"),
    ("logit-bias-value", CHAT_URL, chat(logit_bias={"5": 101}), 400, "logit_bias.5", "100"),
    ("logit-bias-outside-vocab", CHAT_URL, chat(logit_bias={"9999": 1}), 400, "logit_bias", "[0, 256)"),
    ("min-tokens-over-max", COMP_URL, comp(min_tokens=5, max_tokens=2), 400, "min_tokens", "<= max_tokens"),
    ("seed-negative", COMP_URL, comp(seed=-1), 400, "seed", "greater than or equal to 0"),
    ("missing-model", COMP_URL, {"prompt": "Hi"}, 400, "model", "required"),
    ("unknown-model", CHAT_URL, chat(model="gpt-17"), 404, "model", "gpt-17"),
    ("body-is-a-list", CHAT_URL, [1, 2], 400, None, "request body"),
    # Every number has both bounds (2026-11-28: top_k 2**63 passed and crashed the engine's step).
    ("top-k-2**63", CHAT_URL, chat(top_k=2**63), 400, "top_k", "less than or equal to 2147483647"),
    ("top-k-2**31", COMP_URL, comp(top_k=2**31), 400, "top_k", "2147483647"),
    ("top-k-below-minus-one", COMP_URL, comp(top_k=-2), 400, "top_k", "greater than or equal to -1"),
    ("repetition-penalty-below-0.01", CHAT_URL, chat(repetition_penalty=0.001), 400, "repetition_penalty",
     "greater than or equal to 0.01"),
    ("repetition-penalty-over-10", CHAT_URL, chat(repetition_penalty=10.5), 400, "repetition_penalty",
     "less than or equal to 10"),
    ("stop-token-id-2**31", CHAT_URL, chat(stop_token_ids=[2**31]), 400, "stop_token_ids[0]", "2147483647"),
    ("stop-token-id-outside-vocab", CHAT_URL, chat(stop_token_ids=[1, 256]), 400, "stop_token_ids", "[0, 256)"),
    ("prompt-token-id-2**63", COMP_URL, comp(prompt=[1, 2**63]), 400, "prompt[1]", "2147483647"),
    ("seed-2**63", COMP_URL, comp(seed=2**63), 400, "seed", "9223372036854775808"),
    ("priority-over", CHAT_URL, chat(priority=2**31), 400, "priority", "2147483647"),
    ("priority-under", CHAT_URL, chat(priority=-(2**31)), 400, "priority", "-2147483647"),
    ("min-tokens-negative", COMP_URL, comp(min_tokens=-1), 400, "min_tokens", "greater than or equal to 0"),
    ("top-logprobs-negative", CHAT_URL, chat(logprobs=True, top_logprobs=-1), 400, "top_logprobs", "0"),
    ("n-zero", CHAT_URL, chat(n=0), 400, "n", "greater than or equal to 1"),
    ("n-fraction", CHAT_URL, chat(n=1.5), 400, "n", "integer"),
    ("max-tokens-fraction", COMP_URL, comp(max_tokens=2.5), 400, "max_tokens", "integer"),
    ("min-p-over-one", CHAT_URL, chat(min_p=1.0000000000000002), 400, "min_p", "less than or equal to 1"),
    ("presence-penalty-under", CHAT_URL, chat(presence_penalty=-2.0000000000000004), 400, "presence_penalty",
     "greater than or equal to -2"),
    ("temperature-huge-integer", CHAT_URL, chat(temperature=10**400), 400, "temperature", "less than or equal to 2"),
    ("logit-bias-value-huge-integer", CHAT_URL, chat(logit_bias={"5": -(10**400)}), 400, "logit_bias.5", "-100"),
    ("logit-bias-301-entries", CHAT_URL, chat(logit_bias={str(i): 1 for i in range(301)}), 400, "logit_bias",
     "300"),
    ("tool-calls-zero", CHAT_URL, chat(messages=[{"role": "user", "content": "x", "tool_calls": 0}]), 400,
     "messages[0].tool_calls", "valid list"),
    ("best-of-equal-n-but-not-one", COMP_URL, comp(n=2, best_of=3), 400, "best_of", "must equal n"),
]  # fmt: skip

# logit_bias keys: ASCII decimal token ids only (2026-11-28: "²" and "①" answered 500, "٣" and "１" were taken
# as token ids 3 and 1).
NOT_TOKEN_IDS = ["²", "①", "٣", "１", "+5", "-1", " 5", "5 ", "1_0", "", "5\n", "0x10", "1e3", "5.0", "a" * 100]


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"bad{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def api(redis_server, module_prefix):
    """One API for the module: no test here may leave anything queued."""
    with redis_server.client(decode_responses=True) as client:
        publish_model(client, module_prefix, max_model_len=CONTEXT)
    server = ThreadApi(ApiSettings(redis_url=redis_server.url, prefix=module_prefix, api_keys=[API_KEY])).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pure_python_api(redis_server, module_prefix):
    """The same API on asyncio's own loop and h11 (INFERQ_EVENT_LOOP=asyncio, INFERQ_HTTP_PARSER=h11):
    the size limits are ours, not the HTTP parser's, so they must answer the same on both."""
    settings = ApiSettings(
        redis_url=redis_server.url, prefix=module_prefix, api_keys=[API_KEY], event_loop="asyncio", http_parser="h11"
    )
    server = ThreadApi(settings).start()
    yield server
    server.stop()


SERVERS = pytest.mark.parametrize("server", ["api", "pure_python_api"])


@pytest.fixture
def prefix(module_prefix) -> str:
    return module_prefix


@pytest.mark.parametrize(("url", "body", "status", "param", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_body_is_refused_and_nothing_is_enqueued(api, rclient, prefix, url, body, status, param, says):
    with api.client() as client:
        response = client.post(url, json=body)
    error = assert_envelope(response, status)
    assert error["param"] == param
    assert says in error["message"]
    if status == 404:
        assert error["code"] == "model_not_found"
    assert stream_len(rclient, prefix) == 0


@pytest.mark.parametrize("key", NOT_TOKEN_IDS, ids=[ascii(k)[:20] for k in NOT_TOKEN_IDS])
def test_logit_bias_key_that_is_not_an_ascii_token_id_is_400_naming_the_key(api, rclient, prefix, key):
    with api.client() as client:
        response = client.post(CHAT_URL, json=chat(logit_bias={"7": 1, key: 2}))
    error = assert_envelope(response, 400)
    assert error["param"] == "logit_bias"
    assert f"key {key[:40]!r}" in error["message"] and "ASCII digits" in error["message"], error
    assert stream_len(rclient, prefix) == 0


@pytest.mark.parametrize(
    ("headers", "param", "says"),
    [({"Idempotency-Key": "k" * 300}, "Idempotency-Key", "Idempotency-Key header: String should have at most 256"),
     ({"Idempotency-Key": ""}, "Idempotency-Key", "Idempotency-Key header: String should have at least 1")],
    ids=["idempotency-key-300-chars", "idempotency-key-empty"],
)  # fmt: skip
def test_bad_header_is_400_naming_the_header(api, rclient, prefix, headers, param, says):
    with api.client() as client:
        response = client.post(CHAT_URL, json=chat(), headers=headers)
    error = assert_envelope(response, 400)
    assert error["param"] == param and says in error["message"], error
    assert stream_len(rclient, prefix) == 0


@pytest.mark.parametrize(
    "value", ["1" * 40, "12x", "-3", "+3", "٣"], ids=["40-digits", "letters", "negative", "plus", "arabic-digit"]
)
def test_bad_last_event_id_is_400_naming_the_header(api, value):
    with api.client() as client:
        response = client.get("/v1/requests/cmpl-1/stream", headers={"Last-Event-ID": value.encode()})
    error = assert_envelope(response, 400)
    assert error["param"] == "Last-Event-ID" and error["message"].startswith("Last-Event-ID header: "), error


@pytest.mark.parametrize(
    ("raw", "param"),
    [(b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "\\ud800x": 1}' % MODEL.encode(),
      "\\ud800x"),
     (b'{"model": "%s", "prompt": "Hi", "extra": {"\\udc00": 1}}' % MODEL.encode(), "extra.\\udc00"),
     (b'{"model": "%s", "prompt": "Hi", "\\ud800": "x"}' % MODEL.encode(), "\\ud800")],
    ids=["top-level-key", "nested-key", "key-alone"],
)  # fmt: skip
def test_lone_surrogate_in_an_unknown_key_is_400_naming_the_key(api, rclient, prefix, raw, param):
    url = CHAT_URL if b"messages" in raw else COMP_URL
    with api.client() as client:
        response = client.post(url, content=raw, headers={"Content-Type": "application/json"})
    error = assert_envelope(response, 400)
    assert error["param"] == param and "unpaired surrogate" in error["message"], error
    assert stream_len(rclient, prefix) == 0


@pytest.mark.parametrize(
    "raw",
    [b'{"model": "m", "messages": [', b"not json at all", b'{"model": "m", "prompt": "x", "temperature": NaN}',
     b'{"model": "m", "prompt": "x", "temperature": Infinity}', b"",
     b'{"model": "%s", "prompt": "a\\ud800"}' % MODEL.encode(),
     b'{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}' % MODEL.encode(),
     b'{"model": "%s", "prompt": ["a\\ud800"]}' % MODEL.encode()],
    ids=["truncated", "not-json", "nan", "infinity", "empty", "lone-surrogate-prompt", "lone-surrogate-message",
         "lone-surrogate-in-a-prompt-list"],
)  # fmt: skip
def test_malformed_json_is_400(api, rclient, prefix, raw):
    url = CHAT_URL if b"messages" in raw else COMP_URL
    with api.client() as client:
        response = client.post(url, content=raw, headers={"Content-Type": "application/json"})
    error = assert_envelope(response, 400)
    assert error["type"] == "invalid_request_error"
    assert stream_len(rclient, prefix) == 0


@SERVERS
def test_body_over_the_limit_is_413(request, server, rclient, prefix):
    api = request.getfixturevalue(server)
    body = chat(messages=[{"role": "user", "content": "x" * (2 * 1024 * 1024 + 10)}])
    with api.client() as client:
        response = client.post(CHAT_URL, json=body)
    error = assert_envelope(response, 413)
    assert "1048576" in error["message"]
    assert stream_len(rclient, prefix) == 0


@SERVERS
def test_chunked_body_over_the_limit_is_413(request, server, rclient, prefix):
    api = request.getfixturevalue(server)

    def chunks():
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'

    with api.client() as client:
        response = client.post(COMP_URL, content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_envelope(response, 413)
    assert stream_len(rclient, prefix) == 0


@SERVERS
def test_headers_over_the_limit_are_431(request, server, rclient, prefix):
    api = request.getfixturevalue(server)
    with api.client() as client:
        response = client.post(COMP_URL, json=comp(), headers={"X-Padding": "p" * 9000})
    error = assert_envelope(response, 431)
    assert "8192" in error["message"]
    assert stream_len(rclient, prefix) == 0


@pytest.mark.parametrize(
    ("method", "url", "status"),
    [("GET", "/v1/nothing-here", 404), ("GET", CHAT_URL, 405), ("DELETE", "/v1/models", 405)],
)
def test_unknown_routes_and_methods_use_the_envelope(api, method, url, status):
    with api.client() as client:
        response = client.request(method, url)
    assert_envelope(response, status)


@pytest.mark.parametrize(
    ("headers", "message"),
    [({}, "missing API key"), ({"Authorization": "Bearer sk-wrong"}, "incorrect API key"),
     ({"Authorization": f"Basic {API_KEY}"}, "missing API key"), ({"Authorization": "Bearer"}, "missing API key")],
    ids=["missing", "wrong", "not-bearer", "empty"],
)  # fmt: skip
def test_missing_or_wrong_api_key_is_401(api, rclient, prefix, headers, message):
    with api.client(api_key=None) as client:
        # /ready is open to probes (tests/api/test_api_open_routes.py); the schema and its viewers are not.
        for url, method in [(CHAT_URL, "POST"), ("/v1/models", "GET"), ("/metrics", "GET"), ("/openapi.json", "GET"),
                            ("/docs", "GET"), ("/redoc", "GET"), ("/v1/requests/cmpl-1/stream", "GET"),
                            ("/v1/requests/cmpl-1/cancel", "POST")]:  # fmt: skip
            response = client.request(method, url, json=chat() if method == "POST" else None, headers=headers)
            error = assert_envelope(response, 401)
            assert message in error["message"] and error["code"] == "invalid_api_key"
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert stream_len(rclient, prefix) == 0


def test_health_needs_no_key(api):
    with api.client(api_key=None) as client:
        assert client.get("/health").json() == {"status": "ok"}
