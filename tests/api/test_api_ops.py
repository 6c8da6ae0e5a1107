"""Operations routes (/ready, /metrics, /v1/models), CORS, and logprobs in both OpenAI formats."""

from __future__ import annotations

import threading

from tests.api.wire import (
    MODEL,
    AutoResponder,
    chunks,
    done,
    parse_sse,
    publish_heartbeat,
    publish_model,
    token,
    wait_for_request,
    write_event,
)


def test_ready_needs_redis_and_a_live_worker(start_api, rclient, prefix, redis_server):
    api = start_api()
    with api.client() as client:
        not_ready = client.get("/ready")
        assert not_ready.status_code == 503 and not_ready.json()["workers"] == 0
        publish_heartbeat(rclient, prefix)
        assert client.get("/ready").json() == {"status": "ready", "redis": "ok", "workers": 1}
    unreachable = start_api(redis_url="redis://127.0.0.1:1/0")
    with unreachable.client() as client:
        response = client.get("/ready")
        assert response.status_code == 503 and response.json()["redis"].startswith("unreachable")
        assert client.get("/health").status_code == 200
        down = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert down.status_code == 503 and down.json()["error"]["code"] == "backend_unavailable"
        assert down.headers["retry-after"] == "1"


def test_models_lists_the_served_model_and_its_alias(start_api, rclient, prefix):
    publish_model(rclient, prefix, max_model_len=64)
    api = start_api(served_model_name="public-name")
    with api.client() as client:
        cards = client.get("/v1/models").json()
        assert [c["id"] for c in cards["data"]] == ["public-name", MODEL]
        assert cards["object"] == "list" and cards["data"][0]["max_model_len"] == 64
        with AutoResponder(rclient, prefix):
            answer = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).json()
        assert answer["model"] == "public-name"


def test_metrics_use_vllm_names_and_count_what_happened(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    publish_heartbeat(rclient, prefix)  # running=1, waiting=2
    api = start_api()
    with api.client() as client:
        with AutoResponder(rclient, prefix):
            assert client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}).is_success
            assert client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).is_success
        assert client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 99}).status_code == 400
        text = client.get("/metrics").text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    label = f'{{model_name="{MODEL}"}}'
    assert float(lines[f"vllm:time_to_first_token_seconds_count{label}"]) == 2
    assert float(lines[f"vllm:e2e_request_latency_seconds_count{label}"]) == 2
    assert float(lines[f"vllm:request_queue_time_seconds_count{label}"]) == 2
    assert float(lines[f"vllm:generation_tokens_total{label}"]) == 6  # the responder's usage: 3 per request
    assert float(lines[f"vllm:prompt_tokens_total{label}"]) == 10
    assert float(lines[f'vllm:request_success_total{{finished_reason="stop",model_name="{MODEL}"}}']) == 2
    assert float(lines[f"vllm:num_requests_running{label}"]) == 1
    assert float(lines[f"vllm:num_requests_waiting{label}"]) == 2
    assert float(lines['inferq_api_rejected_requests_total{reason="400"}']) == 1
    assert float(lines["inferq_api_live_workers"]) == 1


def test_cors_is_off_unless_origins_are_configured(start_api, rclient, prefix):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with start_api().client() as client:
        assert "access-control-allow-origin" not in client.options("/v1/completions", headers=preflight).headers
    with start_api(cors_origins="https://app.example").client() as client:
        response = client.options("/v1/completions", headers=preflight)
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        other = client.options("/v1/completions", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def answer(rclient, prefix, events) -> None:
    def run() -> None:
        request_id = wait_for_request(rclient, prefix)[-1].id
        for event in events:
            write_event(rclient, prefix, request_id, event)

    threading.Thread(target=run, daemon=True).start()


# The worker's format: per token {token_id, logprob, top: {"id": logprob}}; the byte tokenizer
# names token 72 "H" and 105 "i" (ids are the bytes' ranks in the byte-level alphabet).
LOGPROBS = [{"token_id": 39, "logprob": -0.5, "top": {"39": -0.5, "40": -1.5}}]


def test_chat_logprobs_are_rendered_with_token_strings(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer(rclient, prefix, [token(1, "H", token_ids=[39], logprobs=LOGPROBS), done(2)])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2}
    with api.client() as client:
        response = client.post("/v1/chat/completions", json=body).json()
    assert wait_for_request(rclient, prefix)[0].params["logprobs"] == 2
    content = response["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "H" and content[0]["logprob"] == -0.5 and content[0]["bytes"] == [72]
    assert [(t["token"], t["logprob"]) for t in content[0]["top_logprobs"]] == [("H", -0.5), ("I", -1.5)]


def test_completion_logprobs_stream_in_the_legacy_format(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    second = [{"token_id": 40, "logprob": -0.25, "top": {"40": -0.25}}]
    answer(
        rclient,
        prefix,
        [token(1, "H", token_ids=[39], logprobs=LOGPROBS), token(2, "I", token_ids=[40], logprobs=second), done(3)],
    )
    with api.client() as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "logprobs": 1, "stream": True})
    parts = [c["choices"][0]["logprobs"] for c in chunks(parse_sse(response.text))[:2]]
    assert parts[0] == {"tokens": ["H"], "token_logprobs": [-0.5], "top_logprobs": [{"H": -0.5, "I": -1.5}],
                        "text_offset": [0]}  # fmt: skip
    assert parts[1]["text_offset"] == [1] and parts[1]["tokens"] == ["I"]
