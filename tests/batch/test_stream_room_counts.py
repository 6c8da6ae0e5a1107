"""The runner's two bounds on a batch, read from a real Redis (batch/stream_room.py): the messages no worker has
read stay below `queue_ahead`, and every message sent and not finished stays below the live workers' slots (their
heartbeats) plus `queue_ahead` or a quarter of the slots, whichever is more. The messages here are any
submitter's; the counts are the workers' group's."""

from __future__ import annotations

import json

from batch.stream_room import StreamRoom
from batch.worker_slots import REFRESH_S, WorkerSlots, slots_of
from tests.redis_server import RedisServer
from worker.protocol import Keys

QUEUE_AHEAD = 4


class Clock:
    """A monotonic clock the test moves by hand, for the slots' refresh."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _beat(client, wire: Keys, consumer: str, **fields) -> None:
    record = {"consumer": consumer, "model": "m", "max_model_len": 64, "started": 1.0, "ts": 2.0, "running": 0,
              "waiting": 0, "free_kv_tokens": 64, **fields}  # fmt: skip
    client.set(wire.worker(consumer), json.dumps(record), ex=30)


def _send(client, wire: Keys, count: int) -> None:
    for i in range(count):
        client.xadd(wire.requests, {"v": "1", "id": f"m{i}"})


def _read(client, wire: Keys, count: int) -> list[str]:
    reply = client.xreadgroup(wire.group, "w1", {wire.requests: ">"}, count=count)
    return [message_id for _, entries in reply for message_id, _ in entries]


def test_a_batch_stays_within_the_workers_slots_plus_queue_ahead(redis_server: RedisServer, prefix: str) -> None:
    client = redis_server.client(decode_responses=True)
    wire, clock = Keys(f"{prefix}-room"), Clock()
    room = StreamRoom(client, wire, QUEUE_AHEAD, WorkerSlots(client, wire, clock=clock))
    assert room.room() == QUEUE_AHEAD  # no stream and no worker yet
    _beat(client, wire, "a", slots=3)
    _beat(client, wire, "b", slots=5)
    _beat(client, wire, "old")  # a worker older than the field: no slots
    clock.now += REFRESH_S
    assert room.slots.total() == 8

    _send(client, wire, 3)
    assert room.counts() == (3, 3)  # before any worker made the group every entry is unread
    assert room.room() == 1
    client.xgroup_create(wire.requests, wire.group, id="0")
    read = _read(client, wire, 3)
    assert room.counts() == (0, 3) and room.room() == QUEUE_AHEAD

    _send(client, wire, 7)
    read += _read(client, wire, 7)  # the workers read everything: their slots hold 8, and 2 wait past them
    assert room.counts() == (0, 10)
    assert room.room() == 8 + QUEUE_AHEAD - 10  # the slots bound, not the stream's (which is empty)
    _send(client, wire, 2)
    assert room.counts() == (2, 12) and room.room() == 0
    client.xack(wire.requests, wire.group, *read[:5])  # five finished
    assert room.counts() == (2, 7) and room.room() == QUEUE_AHEAD - 2  # the stream's bound again
    client.close()


def test_beyond_the_slots_a_batch_keeps_a_quarter_of_them_when_that_is_more(
    redis_server: RedisServer, prefix: str
) -> None:
    client = redis_server.client(decode_responses=True)
    wire, clock = Keys(f"{prefix}-quarter"), Clock()
    _beat(client, wire, "a", slots=64)
    room = StreamRoom(client, wire, QUEUE_AHEAD, WorkerSlots(client, wire, clock=clock))
    client.xgroup_create(wire.requests, wire.group, id="0", mkstream=True)
    _send(client, wire, 78)
    _read(client, wire, 78)
    assert room.counts() == (0, 78) and room.room() == 64 + 16 - 78  # 16 past the slots, not queue_ahead's 4
    _send(client, wire, 2)
    _read(client, wire, 2)
    assert room.room() == 0
    client.close()


def test_without_slots_in_any_heartbeat_only_the_unread_count_bounds_a_batch(
    redis_server: RedisServer, prefix: str
) -> None:
    client = redis_server.client(decode_responses=True)
    wire = Keys(f"{prefix}-noslots")
    room = StreamRoom(client, wire, QUEUE_AHEAD)
    _beat(client, wire, "old")
    client.xgroup_create(wire.requests, wire.group, id="0", mkstream=True)
    _send(client, wire, 50)
    _read(client, wire, 49)
    assert room.counts() == (1, 50)
    assert room.room() == QUEUE_AHEAD - 1  # 49 running or queued: no slots to count them against
    client.close()


def test_the_slots_are_looked_up_again_after_their_refresh_period(redis_server: RedisServer, prefix: str) -> None:
    client = redis_server.client(decode_responses=True)
    wire, clock = Keys(f"{prefix}-refresh"), Clock()
    slots = WorkerSlots(client, wire, clock=clock)
    assert slots.total() == 0
    _beat(client, wire, "a", slots=16)
    assert slots.total() == 0  # within the refresh period: the sum as last looked up
    clock.now += REFRESH_S
    assert slots.total() == 16
    client.delete(wire.worker("a"))  # the worker went away (its heartbeat expired)
    clock.now += REFRESH_S
    assert slots.total() == 0
    client.close()


def test_a_heartbeat_that_cannot_be_read_counts_no_slots() -> None:
    assert slots_of(json.dumps({"slots": 12})) == 12
    assert slots_of(json.dumps({"slots": -3})) == 0
    assert slots_of("not json") == 0
    assert slots_of(json.dumps([1, 2])) == 0
    assert slots_of(None) == 0
