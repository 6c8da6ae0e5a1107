"""The reads that ride a step (worker/deferred_replies.py) against a real private Redis: replies read
later come back in order and whole, Redis going away is a connection error and not stale replies,
the deferred read of new messages gives what the waited one gives, the cancel check split into
commands and replies keeps its rules. (The worker sending them during its steps:
tests/worker/test_worker_inprocess.py.)"""

from __future__ import annotations

import pytest
import redis

from tests.redis_server import RedisServer
from tests.worker.harness import request_cancel
from worker.cancel import CancelWatch
from worker.deferred_replies import DeferredReplies
from worker.protocol import Keys
from worker.redis_client import CONNECTION_ERRORS
from worker.stream_reader import StreamReader


def test_replies_come_back_in_order_with_a_refused_command_in_its_place(redis_server, prefix):
    client = redis_server.client()
    client.set(f"{prefix}:a", "1")
    client.rpush(f"{prefix}:list", "x")
    replies = DeferredReplies(client)
    replies.send([("GET", f"{prefix}:a"), ("GET", f"{prefix}:list"), ("MGET", f"{prefix}:a", f"{prefix}:none")])
    assert replies.pending
    client.set(f"{prefix}:a", "2")  # after the send: the replies are what Redis saw then
    got = replies.receive()
    assert not replies.pending
    assert got[0] == b"1" and got[2] == [b"1", None]
    assert isinstance(got[1], redis.ResponseError) and "WRONGTYPE" in str(got[1])
    with pytest.raises(RuntimeError, match="not read"):
        replies.send([("GET", f"{prefix}:a")])
        replies.send([("GET", f"{prefix}:a")])
    assert replies.receive() == [b"2"]
    replies.close()


def test_redis_going_away_is_a_connection_error_and_the_next_send_reconnects(prefix):
    with RedisServer() as server:
        client = server.client()
        client.set(f"{prefix}:a", "1")
        replies = DeferredReplies(client)
        replies.send([("GET", f"{prefix}:a")])
        assert replies.receive() == [b"1"]
        server.restart(hard=True)  # no AOF: it comes back empty
        with pytest.raises(CONNECTION_ERRORS):
            replies.send([("GET", f"{prefix}:a")])
            replies.receive()
        assert not replies.pending
        client.set(f"{prefix}:a", "3")
        replies.send([("GET", f"{prefix}:a"), ("GET", f"{prefix}:a")])
        assert replies.receive() == [b"3", b"3"]
        replies.close()


def test_deferred_read_of_new_messages_matches_the_waited_read(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    reader = StreamReader(client, keys, "w", lease_ms=1000)
    reader.ensure_group()
    ids = [client.xadd(keys.requests, {"n": str(i), "body": "x" * i}).decode() for i in range(5)]
    replies = DeferredReplies(client)
    replies.send([reader.read_new_command(3)])
    first = reader.new_deliveries(replies.receive()[0])
    assert [(d.message_id, d.fields, d.delivery_count) for d in first] == [
        (ids[i], {b"n": str(i).encode(), b"body": b"x" * i}, 1) for i in range(3)
    ]
    waited = reader.read_new(10, None)
    assert [d.message_id for d in waited] == ids[3:]
    replies.send([reader.read_new_command(3)])
    assert reader.new_deliveries(replies.receive()[0]) == []  # nothing new
    client.delete(keys.requests)  # the group goes with its stream (as after an empty restart)
    replies.send([reader.read_new_command(3)])
    assert reader.new_deliveries(replies.receive()[0]) == []
    late = client.xadd(keys.requests, {"n": "late"}).decode()  # the recreated group reads from id 0
    replies.send([reader.read_new_command(3)])
    assert [d.message_id for d in reader.new_deliveries(replies.receive()[0])] == [late]
    replies.close()


def test_cancel_check_in_two_halves_sends_the_mget_only_when_due(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    watch = CancelWatch(keys, full_check_s=60)
    running = ["a", "b"]
    first = watch.commands(running)
    assert [c[0] for c in first] == ["GET", "MGET"]  # the first check reads every key
    assert watch.resolve(running, [None, [None, None]]) == []
    assert [c[0] for c in watch.commands(running)] == ["GET"]
    assert watch.resolve(running, [None]) == []  # the counter did not move
    assert watch.resolve(running, [b"1"]) is None  # it moved and no MGET went with it
    request_cancel(client, keys, "b")
    assert watch.read_keys(client, running, client.get(keys.cancels)) == ["b"]
    assert watch.resolve(running, [client.get(keys.cancels)]) == []  # that counter is now the seen one
    watch.read_all_next()  # requests came in after the check: read them all once
    assert [c[0] for c in watch.commands(running + ["c"])] == ["GET", "MGET"]
    assert watch.check(client, running + ["c"]) == ["b"]
    assert [c[0] for c in watch.commands(running)] == ["GET"]
    assert watch.commands([]) == [] and watch.resolve([], []) == []
