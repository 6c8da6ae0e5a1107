"""Fixtures of the API tests: a private redis-server, real API servers on free ports."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest
import redis

from api.settings import ApiSettings
from tests.api.servers import API_KEY, ThreadApi
from tests.redis_server import RedisServer, make_redis_fixture

redis_server = make_redis_fixture(scope="session")


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix, so tests sharing one Redis never see each other's keys."""
    return f"a{secrets.token_hex(4)}"


@pytest.fixture
def rclient(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client(decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def start_api(redis_server: RedisServer, prefix: str) -> Iterator[Callable[..., ThreadApi]]:
    """Factory: start_api(**settings overrides) -> a running ThreadApi (stopped after the test)."""
    servers: list[ThreadApi] = []

    def _start(**overrides) -> ThreadApi:
        values = {"redis_url": redis_server.url, "prefix": prefix, "api_keys": [API_KEY], "resume_grace_s": 0.5}
        server = ThreadApi(ApiSettings(**{**values, **overrides})).start()
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.stop()
