"""The worker's Redis pieces against a real private Redis, without an engine: publisher
exactly-once, lease renewal and loss, claiming abandoned messages, reading priors back, the
cancel watch."""

from __future__ import annotations

import threading
import time

import pytest

from tests.worker.harness import read_events, request_cancel
from worker.cancel import CancelWatch
from worker.event_publisher import HANDOFF_IDLE_MS, Batch, EventWrite, Publisher
from worker.lease import LeaseKeeper
from worker.protocol import Keys, ResultEvent, decode_event
from worker.resume import parse_priors, queue_prior_reads
from worker.stream_reader import StreamReader


def _token(seq: int, token: int, worker: str = "w1", index: int = 0) -> ResultEvent:
    return ResultEvent(seq=seq, type="token", index=index, text=f"t{token}", token_ids=[token], worker=worker)


def _publisher(client, keys, consumer="w1"):
    lost: list[str] = []
    written: list[tuple[int, int]] = []
    publisher = Publisher(client, keys, consumer, 60, lost.append, lambda n, d: written.append((n, d)))
    publisher.start()
    return publisher, lost, written


def _write(keys, request_id, *events) -> Batch:
    stream, channel = keys.result(request_id), keys.events(request_id)
    return Batch(events=[EventWrite(request_id, stream, channel, e) for e in events])


def test_publisher_writes_exactly_once_and_spots_another_writer(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    publisher, lost, written = _publisher(client, keys)
    batch = _write(keys, "r1", _token(1, 10), _token(2, 11))
    publisher.submit(batch)
    publisher.submit(batch)  # a retry after a lost reply: already written
    assert publisher.flush(5)
    assert [e.token_ids for _, e in read_events(client, keys, "r1")] == [[10], [11]]
    assert sum(d for _, d in written) == 2 and lost == []
    assert 0 < client.ttl(keys.result("r1")) <= 60

    client.xadd(
        keys.result("r2"), {"v": "1", "seq": "1", "type": "token", "token_ids": "[5]", "worker": "w2"}, id="0-1"
    )
    publisher.submit(_write(keys, "r2", _token(1, 99)))
    assert publisher.flush(5)
    assert lost == ["r2"]  # another worker owns r2 now
    assert [e.token_ids for _, e in read_events(client, keys, "r2")] == [[5]]
    assert publisher.close(5)


def test_publisher_acknowledges_after_the_terminal_event_and_hands_off(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    client.xgroup_create(keys.requests, keys.group, id="0", mkstream=True)
    done_id = client.xadd(keys.requests, {"v": "1", "id": "a", "prompt": "x"}).decode()
    handoff_id = client.xadd(keys.requests, {"v": "1", "id": "b", "prompt": "x"}).decode()
    client.xreadgroup(keys.group, "w1", {keys.requests: ">"})
    publisher, _, _ = _publisher(client, keys)
    batch = _write(keys, "a", _token(1, 3), ResultEvent(seq=2, type="done", finish_reason="stop", worker="w1"))
    batch.acks.append(done_id)
    batch.handoffs.append(handoff_id)
    publisher.submit(batch)
    assert publisher.close(5)
    (pending,) = client.xpending_range(keys.requests, keys.group, "-", "+", 10)
    assert pending["message_id"].decode() == handoff_id
    assert pending["time_since_delivered"] >= HANDOFF_IDLE_MS  # claimable by anyone at once
    assert [e.type for _, e in read_events(client, keys, "a")] == ["token", "done"]


def test_publisher_announces_each_event_once_in_order(redis_server, prefix):
    """Live copies go out with their stream entries; a retried write is not announced again."""
    keys, client = Keys(prefix), redis_server.client()
    pubsub = client.pubsub()
    pubsub.subscribe(keys.events("r1"))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    publisher, _, written = _publisher(client, keys)
    batch = _write(keys, "r1", _token(1, 10), _token(2, 11))
    publisher.submit(batch)
    publisher.submit(batch)
    publisher.submit(_write(keys, "r1", ResultEvent(seq=3, type="done", finish_reason="length", worker="w1")))
    assert publisher.close(5)
    messages = []
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        messages.append(decode_event(message["data"]))
    pubsub.close()
    assert [(e.seq, e.type, e.token_ids) for e in messages] == [
        (1, "token", [10]),
        (2, "token", [11]),
        (3, "done", None),
    ]
    assert sum(n for n, _ in written) == 5 and sum(d for _, d in written) == 2  # batches may be merged


def test_publisher_refreshes_expiry_on_first_and_terminal_events_not_per_token(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    publisher, _, _ = _publisher(client, keys)  # result_ttl_s = 60
    stream = keys.result("r1")
    publisher.submit(_write(keys, "r1", _token(1, 10)))
    assert publisher.flush(5)
    assert 55 < client.ttl(stream) <= 60  # the first write sets it
    client.expire(stream, 1000)  # a token event soon after must not touch it (no EXPIRE per token)
    publisher.submit(_write(keys, "r1", _token(2, 11)))
    assert publisher.flush(5)
    assert client.ttl(stream) > 900
    publisher.submit(_write(keys, "r1", ResultEvent(seq=3, type="done", finish_reason="stop", worker="w1")))
    assert publisher.flush(5)
    assert 55 < client.ttl(stream) <= 60  # the stream lives result_ttl_s after its last event
    assert publisher.close(5)


def test_publisher_keeps_the_request_id_owned_as_long_as_its_result_stream(redis_server, prefix):
    """The owner key admission sets (worker/admit.py) expires with the result stream: refreshed by the first
    and terminal events, not per token; a request without one gets none."""
    keys, client = Keys(prefix), redis_server.client()
    publisher, _, _ = _publisher(client, keys)  # result_ttl_s = 60
    client.set(keys.owner("r1"), "1-0", ex=5)
    publisher.submit(_write(keys, "r1", _token(1, 10)))
    assert publisher.flush(5)
    assert 55 < client.ttl(keys.owner("r1")) <= 60
    client.expire(keys.owner("r1"), 1000)
    publisher.submit(_write(keys, "r1", _token(2, 11)))
    assert publisher.flush(5)
    assert client.ttl(keys.owner("r1")) > 900
    publisher.submit(_write(keys, "r1", ResultEvent(seq=3, type="done", finish_reason="stop", worker="w1")))
    publisher.submit(_write(keys, "r2", ResultEvent(seq=1, type="error", error="bad", worker="w1")))
    assert publisher.flush(5)
    assert 55 < client.ttl(keys.owner("r1")) <= 60 and client.get(keys.owner("r1")) == b"1-0"
    assert not client.exists(keys.owner("r2")) and client.xlen(keys.result("r2")) == 1
    assert publisher.close(5)


def test_publisher_keeps_events_while_redis_is_down(redis_server, prefix):
    from tests.redis_server import RedisServer

    keys = Keys(prefix)
    with RedisServer(appendonly=True) as server:
        client = server.client()
        publisher, _, _ = _publisher(client, keys)
        server.halt(hard=True)
        publisher.submit(_write(keys, "r", _token(1, 1)))
        publisher.submit(_write(keys, "r", _token(2, 2)))
        assert not publisher.flush(0.5)
        server.start()
        assert publisher.flush(10)
        assert [e.seq for _, e in read_events(client, keys, "r")] == [1, 2]
        publisher.close(1)


def test_lease_renews_own_messages_and_reports_taken_ones(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    client.xgroup_create(keys.requests, keys.group, id="0", mkstream=True)
    ids = [client.xadd(keys.requests, {"n": str(i)}).decode() for i in range(3)]
    client.xreadgroup(keys.group, "w1", {keys.requests: ">"})
    time.sleep(0.2)
    client.xclaim(keys.requests, keys.group, "w2", 0, [ids[1]])  # taken over while w1 was frozen
    client.xack(keys.requests, keys.group, ids[2])  # finished meanwhile
    lost_reports: list[list[str]] = []
    keeper = LeaseKeeper(client, keys, "w1", 150, lambda: list(ids), lost_reports.append)
    assert sorted(keeper.renew(ids)) == sorted(ids[1:])
    rows = {r["message_id"].decode(): r for r in client.xpending_range(keys.requests, keys.group, "-", "+", 10)}
    assert rows[ids[0]]["consumer"] == b"w1" and rows[ids[0]]["time_since_delivered"] < 100  # renewed
    assert rows[ids[1]]["consumer"] == b"w2"  # never taken back
    assert rows[ids[0]]["times_delivered"] == 1  # JUSTID: renewals are not deliveries
    keeper.start()
    deadline = time.monotonic() + 5
    while not lost_reports and time.monotonic() < deadline:
        time.sleep(0.01)
    keeper.stop()
    assert sorted(lost_reports[0]) == sorted(ids[1:])


def test_claim_takes_only_messages_idle_beyond_the_lease(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    reader = StreamReader(client, keys, "alive", lease_ms=300)
    reader.ensure_group()
    reader.ensure_group()  # idempotent
    stale = client.xadd(keys.requests, {"n": "1"}).decode()
    client.xreadgroup(keys.group, "dead", {keys.requests: ">"})
    fresh = client.xadd(keys.requests, {"n": "2"}).decode()
    client.xreadgroup(keys.group, "busy", {keys.requests: ">"})
    client.xclaim(keys.requests, keys.group, "dead", 0, [stale], idle=10_000, justid=True)  # long idle
    claimed = reader.claim_abandoned(10)
    assert [d.message_id for d in claimed] == [stale]
    assert claimed[0].delivery_count == 2
    assert reader.read_new(10, None) == []
    client.xgroup_destroy(keys.requests, keys.group)  # Redis came back without the group
    again = client.xadd(keys.requests, {"n": "3"}).decode()
    assert [d.message_id for d in reader.read_new(10, None)] == [stale, fresh, again]
    assert fresh  # read again from id 0: admission acknowledges what is already complete


def test_priors_fold_tokens_per_choice(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    publisher, _, _ = _publisher(client, keys)
    publisher.submit(
        _write(
            keys,
            "p",
            _token(1, 7, index=0),
            _token(2, 8, index=1),
            _token(3, 9, index=0),
            ResultEvent(seq=4, type="done", index=1, finish_reason="stop", worker="w1"),
        )
    )
    assert publisher.close(5)
    streams, pipe = [keys.result("p"), keys.result("nothing")], client.pipeline(transaction=False)
    queue_prior_reads(pipe, streams)  # as the admission queues them, beside its cancel keys' MGET
    prior, empty = parse_priors(streams, pipe.execute(raise_on_error=False))
    assert prior.next_seq == 5 and prior.done_indices == {1}
    assert prior.engine_prior(2) == [[7, 9], [8]]
    assert not prior.is_complete(2) and prior.is_complete(1)
    assert empty.next_seq == 1 and empty.engine_prior(1) is None and not empty.has_output


@pytest.mark.timeout(30)
def test_blocking_read_wakes_on_arrival(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    reader = StreamReader(client, keys, "w", lease_ms=1000)
    reader.ensure_group()
    threading.Timer(0.1, lambda: client.xadd(keys.requests, {"n": "1"})).start()
    started = time.monotonic()
    (delivery,) = reader.read_new(5, 5000)
    assert time.monotonic() - started < 3
    assert delivery.delivery_count == 1 and delivery.fields == {b"n": b"1"}


def test_trim_drops_only_acknowledged_requests(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    reader = StreamReader(client, keys, "w", lease_ms=1000)
    reader.ensure_group()
    assert reader.trim_acknowledged() == 0
    ids = [client.xadd(keys.requests, {"n": str(i)}).decode() for i in range(10)]
    client.xreadgroup(keys.group, "w", {keys.requests: ">"}, count=6)  # 0..5 delivered, 6..9 queued
    client.xack(keys.requests, keys.group, *ids[:3], ids[4])  # 3 and 5 still pending
    assert reader.trim_acknowledged() == 3
    assert [i.decode() for i, _ in client.xrange(keys.requests)] == ids[3:]
    client.xack(keys.requests, keys.group, ids[3], ids[5])
    assert reader.trim_acknowledged() == 2  # up to the last delivered entry, which stays
    assert [i.decode() for i, _ in client.xrange(keys.requests)] == ids[5:]


def test_cancel_watch_reads_keys_when_the_counter_moves_and_on_its_full_check_period(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    watch = CancelWatch(keys, full_check_s=0.3)
    running = ["a", "b", "c"]
    assert watch.check(client, running) == [] and watch.num_full_reads == 1  # the first check reads all
    assert watch.check(client, running) == [] and watch.num_full_reads == 1  # nothing moved: one GET only
    request_cancel(client, keys, "b")  # SET + INCR: seen by the very next check
    assert watch.check(client, running) == ["b"] and watch.num_full_reads == 2
    client.set(keys.cancel("c"), "1")  # a canceller that does not INCR: seen once the period is over
    assert watch.check(client, running) == [] and watch.num_full_reads == 2
    time.sleep(0.35)
    assert watch.check(client, running) == ["b", "c"] and watch.num_full_reads == 3
    client.delete(keys.cancels)  # Redis lost the counter (restart): that is a move too
    assert watch.check(client, running) == ["b", "c"] and watch.num_full_reads == 4
    assert watch.check(client, []) == []
