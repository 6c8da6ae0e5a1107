"""The API's caches of what the workers publish (api/model_info.py, api/tokens.py): once something is known,
a stale cache answers without waiting on Redis (a request that yielded there let a burst's other requests run
ahead of its XADD, api/background_refresh.py) and one task re-reads it behind; nothing known yet is waited for.
A real Redis; the caches' refresh intervals set to 0 so that every read finds them stale."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from api import model_info, tokens
from api.model_info import ModelRegistry
from api.tokens import TokenizerCache
from bench.service_processes import free_port
from tests.api.wire import publish_model
from worker.protocol import Keys


def answered_without_suspending(coroutine):
    """The coroutine's result if it finished without ever suspending (else the test fails)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    pytest.fail("the call suspended (it waited on Redis)")


def test_a_known_model_answers_at_once_and_is_reread_behind(redis_server, rclient, prefix, monkeypatch):
    monkeypatch.setattr(model_info, "CACHE_S", 0.0)

    async def run() -> None:
        client = aredis.Redis.from_url(redis_server.url, decode_responses=True)
        registry = ModelRegistry(client, Keys(prefix))
        assert await registry.info() is None  # nothing published: waited for, every time
        publish_model(rclient, prefix, max_model_len=64)
        assert (await registry.info()).max_model_len == 64  # nothing known before: waited for
        publish_model(rclient, prefix, max_model_len=128)
        assert answered_without_suspending(registry.info()).max_model_len == 64  # stale, at once
        await registry._refresher.wait()
        assert answered_without_suspending(registry.info()).max_model_len == 128  # the re-read's
        await registry._refresher.wait()
        await client.aclose()

    asyncio.run(run())


def test_a_failed_reread_keeps_the_known_model(redis_server, rclient, prefix, monkeypatch, caplog):
    monkeypatch.setattr(model_info, "CACHE_S", 0.0)

    async def run() -> None:
        client = aredis.Redis.from_url(redis_server.url, decode_responses=True)
        registry = ModelRegistry(client, Keys(prefix))
        publish_model(rclient, prefix, max_model_len=64)
        assert (await registry.info()).max_model_len == 64
        # nothing listens there; no retries, so that the re-read fails at once
        registry.redis = aredis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        assert answered_without_suspending(registry.info()).max_model_len == 64
        await registry._refresher.wait()
        assert (await registry.info()).max_model_len == 64
        await registry._refresher.wait()
        await client.aclose()

    with caplog.at_level(logging.WARNING, logger="inferq.api"):
        asyncio.run(run())
    assert "refreshing the model record failed" in caplog.text


def test_a_loaded_tokenizer_answers_at_once_and_is_rechecked_behind(redis_server, rclient, prefix, monkeypatch):
    monkeypatch.setattr(tokens, "REFRESH_INTERVAL_S", 0.0)

    async def run() -> None:
        client = aredis.Redis.from_url(redis_server.url, decode_responses=True)
        cache = TokenizerCache(Keys(prefix).tokenizer)
        assert await cache.get(client) is None  # nothing published: waited for
        publish_model(rclient, prefix)
        loaded = await cache.get(client)
        assert loaded is not None and loaded.count_text("abc") == 3  # the byte tokenizer
        rclient.delete(Keys(prefix).tokenizer)  # withdrawn: seen by the re-check, not by this read
        assert answered_without_suspending(cache.get(client)) is loaded
        await cache._refresher.wait()
        assert await cache.get(client) is None  # nothing loaded any more: waited for
        await client.aclose()

    asyncio.run(run())
