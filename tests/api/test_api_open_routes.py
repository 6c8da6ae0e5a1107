"""Which routes an API key guards: all but /health, /ready and the chat page (/, /static/*), the API's own
schema and its viewers included; /ready answers a probe without a key."""

from __future__ import annotations

from collections.abc import Iterator

from tests.api.wire import assert_envelope, publish_heartbeat
from tests.redis_server import free_port

# The README: "checked on every route but /health, /ready and the chat page".
OPEN = {"/health", "/ready", "/", "/static/{name}"}


def http_routes(routes: list) -> Iterator[tuple[str, str]]:
    """(path, method) of every HTTP route, those of included routers too (FastAPI keeps them in the router
    they were declared in, without a prefix here)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from http_routes(included.routes)
        elif getattr(route, "methods", None):
            yield from ((route.path, method) for method in route.methods if method != "HEAD")


def test_every_route_but_the_open_ones_needs_a_key(start_api):
    api = start_api()
    routes = list(http_routes(api.server.config.app.routes))
    paths = {path for path, _ in routes}
    assert {"/openapi.json", "/docs", "/redoc", "/metrics", "/v1/models"} <= paths
    assert paths >= OPEN
    with api.client(api_key=None) as client:
        for path, method in routes:
            url = path.replace("{name}", "app.js").replace("{request_id}", "cmpl-1")
            response = client.request(method, url, json={} if method == "POST" else None)
            if path in OPEN:
                assert response.status_code != 401, (method, path)
            else:
                error = assert_envelope(response, 401)
                assert error["code"] == "invalid_api_key", (method, path)


def test_the_schema_and_its_viewers_answer_with_a_key(start_api):
    api = start_api()
    with api.client() as client:
        schema = client.get("/openapi.json")
        assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]
        for path in ("/docs", "/redoc"):
            page = client.get(path)
            assert page.status_code == 200 and "/openapi.json" in page.text
            assert page.headers["content-type"].startswith("text/html")


def test_without_keys_configured_the_schema_is_open(start_api):
    api = start_api(api_keys=[])
    with api.client(api_key=None) as client:
        assert "/v1/completions" in client.get("/openapi.json").json()["paths"]
        assert client.get("/docs").status_code == 200 and client.get("/redoc").status_code == 200


def test_the_chat_page_needs_no_key(start_api):
    with start_api().client(api_key=None) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert client.get("/static/app.js").status_code == 200


def test_ready_answers_a_probe_without_a_key(start_api, rclient, prefix):
    api = start_api()
    with api.client(api_key=None) as probe, api.client(api_key="sk-wrong") as wrong:
        not_ready = probe.get("/ready")
        assert not_ready.status_code == 503 and not_ready.json() == {"status": "not ready", "redis": "ok", "workers": 0}
        publish_heartbeat(rclient, prefix)
        assert probe.get("/ready").json() == {"status": "ready", "redis": "ok", "workers": 1}
        assert wrong.get("/ready").status_code == 200  # a wrong key is no reason to fail a probe
        assert probe.get("/health").json() == {"status": "ok"}


def test_ready_shows_the_redis_error_only_with_a_key(start_api):
    port = free_port()  # nothing listens there
    api = start_api(redis_url=f"redis://127.0.0.1:{port}/0")
    with api.client(api_key=None) as probe, api.client() as operator:
        anonymous = probe.get("/ready")
        assert anonymous.status_code == 503 and anonymous.json() == {
            "status": "not ready",
            "redis": "unreachable",
            "workers": 0,
        }
        detailed = operator.get("/ready")
        assert detailed.status_code == 503 and detailed.json()["redis"].startswith("unreachable: ")
        assert f"127.0.0.1:{port}" in detailed.json()["redis"]
