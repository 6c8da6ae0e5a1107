"""api/event_hub.py against a real Redis: one pub/sub connection for every stream of a process, a
subscription that exists in Redis before subscribe() returns, per-reader ordered delivery, and a
broken connection that every reader hears about and the next subscribe replaces."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from api.event_hub import EventHub
from tests.redis_server import RedisServer


def _channel(name: str) -> str:
    return f"hubtest{secrets.token_hex(3)}:events:{name}"


async def _with_hub(server: RedisServer, body) -> None:
    redis = Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    hub = EventHub(redis, _channel("~anchor"))
    try:
        await body(redis, hub)
    finally:
        await hub.close()
        await redis.aclose()


async def _pubsub_clients(redis: Redis) -> int:
    """Connections of this Redis that hold a channel subscription."""
    return sum(1 for client in await redis.client_list() if int(client.get("sub", 0)) > 0)


def test_streams_share_one_connection_and_are_subscribed_before_subscribe_returns(redis_server: RedisServer) -> None:
    async def body(redis: Redis, hub: EventHub) -> None:
        before = await _pubsub_clients(redis)
        channels = [_channel(f"r{i}") for i in range(20)]
        subs = await asyncio.gather(*(hub.subscribe(c) for c in channels))
        # Redis already counts each subscriber: a PUBLISH right now reaches it (the submit path's guarantee).
        assert [n for _, n in await redis.pubsub_numsub(*channels)] == [1] * len(channels)
        assert await _pubsub_clients(redis) - before == 1
        for i, c in enumerate(channels):
            assert await redis.publish(c, f"m{i}") == 1
        assert [await s.get(timeout=5) for s in subs] == [f"m{i}" for i in range(len(channels))]
        for s in subs:
            await s.close()
        assert hub.channels == 0
        # UNSUBSCRIBE is sent without waiting for Redis's reply, and this check comes on another
        # connection, which Redis may serve first: wait for the unsubscriptions to land.
        deadline = asyncio.get_running_loop().time() + 5
        while [n for _, n in await redis.pubsub_numsub(*channels)] != [0] * len(channels):
            assert asyncio.get_running_loop().time() < deadline, "the hub did not unsubscribe"
            await asyncio.sleep(0.01)

    asyncio.run(_with_hub(redis_server, body))


def test_each_reader_gets_every_message_in_order_and_the_channel_lives_while_one_reads(
    redis_server: RedisServer,
) -> None:
    async def body(redis: Redis, hub: EventHub) -> None:
        channel = _channel("shared")
        first, second = await hub.subscribe(channel), await hub.subscribe(channel)
        for i in range(50):
            await redis.publish(channel, str(i))
        assert [await first.get(timeout=5) for _ in range(50)] == [str(i) for i in range(50)]
        assert [await second.get(timeout=5) for _ in range(50)] == [str(i) for i in range(50)]
        await first.close()
        await redis.publish(channel, "after")
        assert await second.get(timeout=5) == "after"
        assert await first.get(timeout=0.05) is None  # a closed reader gets nothing more
        await second.close()
        assert (await redis.pubsub_numsub(channel))[0][1] == 0
        assert await second.get(timeout=0.05) is None

    asyncio.run(_with_hub(redis_server, body))


def test_leaving_and_joining_again_at_once_keeps_the_new_reader_subscribed(redis_server: RedisServer) -> None:
    async def body(redis: Redis, hub: EventHub) -> None:
        channel = _channel("again")
        for round_ in range(20):
            sub = await hub.subscribe(channel)
            assert (await redis.pubsub_numsub(channel))[0][1] == 1
            await redis.publish(channel, f"x{round_}")
            assert await sub.get(timeout=5) == f"x{round_}"
            await sub.close()  # its UNSUBSCRIBE and the next SUBSCRIBE go out back to back

    asyncio.run(_with_hub(redis_server, body))


def test_silence_is_a_timeout_not_an_error(redis_server: RedisServer) -> None:
    async def body(redis: Redis, hub: EventHub) -> None:
        sub = await hub.subscribe(_channel("quiet"))
        assert await sub.get(timeout=0.05) is None
        await sub.close()

    asyncio.run(_with_hub(redis_server, body))


def test_a_dropped_connection_is_replaced_with_every_subscription(redis_server: RedisServer) -> None:
    async def body(redis: Redis, hub: EventHub) -> None:
        a, b = _channel("a"), _channel("b")
        sub_a, sub_b = await hub.subscribe(a), await hub.subscribe(b)
        await redis.client_kill_filter(_type="pubsub")
        # redis-py reconnects on the next read and subscribes again to what the hub listened to;
        # what was published in between is lost (EventSource reads it back from the result stream).
        for _ in range(200):
            if (await redis.pubsub_numsub(a, b)) == [(a, 1), (b, 1)]:
                break
            await asyncio.sleep(0.01)
        assert await redis.publish(a, "back a") == 1
        assert await redis.publish(b, "back b") == 1
        assert await sub_a.get(timeout=5) == "back a"
        assert await sub_b.get(timeout=5) == "back b"
        assert await _pubsub_clients(redis) >= 1

    asyncio.run(_with_hub(redis_server, body))


def test_redis_going_away_reaches_every_reader_and_the_next_subscribe_reconnects() -> None:
    async def body() -> None:
        server = RedisServer().start()
        redis = Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        hub = EventHub(redis, _channel("~anchor"))
        try:
            a, b = _channel("a"), _channel("b")
            sub_a, sub_b = await hub.subscribe(a), await hub.subscribe(b)
            await asyncio.to_thread(server.halt)
            for sub in (sub_a, sub_b):
                with pytest.raises(RedisConnectionError):
                    for _ in range(300):  # ends with the error; a None is only a timeout before it came
                        assert await sub.get(timeout=0.1) is None
                await sub.close()
            assert hub.channels == 0
            with pytest.raises(RedisConnectionError):
                await hub.subscribe(a)  # nothing listens: the submit path answers 503
            await asyncio.to_thread(server.start)
            fresh = await hub.subscribe(a)
            assert await redis.publish(a, "back") == 1
            assert await fresh.get(timeout=5) == "back"
            await fresh.close()
        finally:
            await hub.close()
            await redis.aclose()
            server.stop()

    asyncio.run(body())


def test_subscribe_fails_cleanly_when_redis_is_unreachable() -> None:
    async def body() -> None:
        server = RedisServer().start()
        port = server.port
        server.stop()  # nothing listens on the port any more
        redis = Redis(host="127.0.0.1", port=port, decode_responses=True)
        hub = EventHub(redis, _channel("~anchor"))
        with pytest.raises(RedisConnectionError):
            await hub.subscribe(_channel("nobody"))
        assert hub.channels == 0
        await hub.close()
        await redis.aclose()

    asyncio.run(body())


def test_an_unconfirmed_subscribe_returns_once_sent_and_is_confirmed_later(redis_server: RedisServer) -> None:
    async def body(redis: Redis, hub: EventHub) -> None:
        channels = [_channel(f"u{i}") for i in range(20)]
        subs = [await hub.subscribe(c, confirmed=False) for c in channels]  # nothing awaited from Redis yet
        await asyncio.gather(*(s.confirmed() for s in subs))
        assert [n for _, n in await redis.pubsub_numsub(*channels)] == [1] * len(channels)
        for i, c in enumerate(channels):
            assert await redis.publish(c, f"m{i}") == 1
        assert [await s.get(timeout=5) for s in subs] == [f"m{i}" for i in range(len(channels))]
        # closed before its confirmation came: the channel is dropped, and a new reader waits for its own
        early = await hub.subscribe(channels[0] + "x", confirmed=False)
        await early.close()
        again = await hub.subscribe(channels[0] + "x")
        assert (await redis.pubsub_numsub(channels[0] + "x"))[0][1] == 1
        for s in [*subs, again]:
            await s.close()
        assert hub.channels == 0

    asyncio.run(_with_hub(redis_server, body))
