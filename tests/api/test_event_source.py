"""api/events.py against a real Redis: a source whose SUBSCRIBE was only sent (the submit path's
open(confirmed=False)) yields every event exactly once and in order, whether the worker wrote it before
Redis listened on the channel (the result stream has it) or after (the channel brings it)."""

from __future__ import annotations

import asyncio
import secrets

from redis.asyncio import Redis

from api.event_hub import EventHub
from api.events import EventSource
from tests.redis_server import RedisServer
from worker.protocol import Keys, ResultEvent, encode_event_for_write, stream_id


async def _write(redis: Redis, keys: Keys, request_id: str, event: ResultEvent) -> None:
    """As a worker writes an event: to the result stream first, then published."""
    fields, message = encode_event_for_write(event)
    await redis.xadd(keys.result(request_id), fields, id=stream_id(event.seq))
    await redis.publish(keys.events(request_id), message)


async def _read_into(source: EventSource, seen: list[int]) -> None:
    async for event in source.events():
        seen.append(event.seq)


def test_an_unconfirmed_source_yields_events_from_before_and_after_redis_listened(redis_server: RedisServer) -> None:
    async def body() -> None:
        redis = Redis(host="127.0.0.1", port=redis_server.port, decode_responses=True)
        keys = Keys(f"srctest{secrets.token_hex(3)}")
        hub = EventHub(redis, keys.events("~anchor"))
        try:
            for round_ in range(10):
                request_id = f"r{round_}"
                source = EventSource(redis, hub, keys, request_id, keys.result(request_id), n=1, poll_s=5.0)
                await source.open(confirmed=False)
                # written at once, racing the SUBSCRIBE: before or after Redis listens
                await _write(redis, keys, request_id, ResultEvent(seq=1, type="token", text="a", token_ids=[1]))
                seen: list[int] = []
                reader = asyncio.create_task(_read_into(source, seen))
                await asyncio.sleep(0.01)
                await _write(redis, keys, request_id, ResultEvent(seq=2, type="token", text="b", token_ids=[2]))
                await _write(redis, keys, request_id, ResultEvent(seq=3, type="done", finish_reason="length"))
                await asyncio.wait_for(reader, 3.0)  # well inside poll_s: the channel delivered 2 and 3
                assert seen == [1, 2, 3]
                await source.close()
            assert hub.channels == 0
        finally:
            await hub.close()
            await redis.aclose()

    asyncio.run(body())
