"""Auth settings and a server with no model yet (each test has its own API server)."""

from __future__ import annotations

from tests.api.wire import MODEL, assert_envelope, publish_model, stream_len

CHAT_URL = "/v1/chat/completions"


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **fields}


def test_no_keys_configured_means_auth_off(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    server = start_api(api_keys=[])
    with server.client(api_key=None) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == MODEL


def test_every_configured_key_is_accepted(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    server = start_api(api_keys=["k-one", "k-two"])
    for key in ("k-one", "k-two"):
        with server.client(api_key=key) as client:
            assert client.get("/v1/models").status_code == 200
    with server.client(api_key="k-one-but-longer") as client:
        assert client.get("/v1/models").status_code == 401


def test_no_model_published_yet_is_503(start_api, rclient, prefix):
    server = start_api()
    with server.client() as client:
        response = client.post(CHAT_URL, json=chat())
    error = assert_envelope(response, 503)
    assert error["code"] == "no_model" and response.headers["retry-after"]
    assert stream_len(rclient, prefix) == 0
