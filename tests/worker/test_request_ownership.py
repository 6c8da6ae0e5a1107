"""A request id, and so its result stream, belongs to the first message admitted with it: a second message
can neither name another request's result stream nor reuse a running or finished id to write into it, on
this worker or another one; the same message delivered again (a dead worker's, a lease takeover) resumes.

Real Redis, the real worker in a thread (or its Admitter over real stream readers), the tiny Llama on CPU.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.worker.harness import (
    ThreadWorker,
    assert_exactly_once,
    make_settings,
    read_events,
    submit,
    tokens_by_index,
    wait_complete,
)
from worker.admit import Admitter
from worker.protocol import Keys
from worker.stream_reader import StreamReader

pytestmark = pytest.mark.timeout(180)

VICTIM = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
FINISHED = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}


@pytest.fixture
def engine(worker_model_dir):
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SchedulerConfig

    config = EngineConfig(
        model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
        cache=CacheConfig(num_kv_tokens=4096),
        scheduler=SchedulerConfig(max_num_seqs=32),
        device="cpu",
        async_scheduling=False,
    )
    return LLMEngine(config)


def _wait(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _seen(events) -> list[tuple]:
    """What a client reads of a stream: every field but the writer's name."""
    return [(e.seq, e.type, e.index, e.text, e.token_ids, e.finish_reason, e.usage, e.error) for e in events]


def _serve(redis_server, prefix, model_dir, engine, attack: bool) -> dict:
    """Runs a finished request, then a long one ("victim"), with or without the attacks while the victim
    runs; returns both streams, the attacker's and the dead letters."""
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, model_dir), engine=engine):
        submit(client, keys, "finished", prompt="An early request", params=FINISHED)
        wait_complete(client, keys, ["finished"])
        victim_message = submit(client, keys, "victim", prompt="Tell me a long story", params=VICTIM)
        _wait(lambda: read_events(client, keys, "victim"), "the victim's first token")
        if attack:
            # a result stream of another request's
            submit(client, keys, "attacker", prompt="x", result_stream=keys.result("victim"), params=FINISHED)
            # the running request's id: a well-formed job, and a malformed one (its error must not land there)
            submit(client, keys, "victim", prompt="Hijacked", params={"max_tokens": 2, "temperature": 0})
            submit(client, keys, "victim", prompt="x", params={"temperature": -1})
            # a finished request's id (its result stream is still there)
            submit(client, keys, "finished", prompt="Again", params={"max_tokens": 2, "temperature": 0})
            _wait(lambda: client.xlen(keys.dead) == 4, "four dead letters")
        wait_complete(client, keys, ["victim"])
        assert client.xpending(keys.requests, keys.group)["pending"] == 0
    letters = client.xrange(keys.dead)
    return {
        "victim": assert_exactly_once(client, keys, "victim"),
        "finished": assert_exactly_once(client, keys, "finished"),
        "attacker": [event for _, event in read_events(client, keys, "attacker")],
        "victim_message": victim_message,
        "dead": [(f[b"id"].decode(), f[b"reason"].decode(), json.loads(f[b"fields"])) for _, f in letters],
    }


def test_other_messages_cannot_write_into_a_requests_result_stream(redis_server, prefix, worker_model_dir, engine):
    calm = _serve(redis_server, f"{prefix}-calm", worker_model_dir, engine, attack=False)
    got = _serve(redis_server, prefix, worker_model_dir, engine, attack=True)
    assert calm["dead"] == [] and calm["attacker"] == []
    assert len(tokens_by_index(calm["victim"])[0]) == 40
    # Both streams read exactly as in the undisturbed run: one "done", no foreign event, no token lost.
    assert _seen(got["victim"]) == _seen(calm["victim"])
    assert _seen(got["finished"]) == _seen(calm["finished"])
    letters = {(rid, fields["prompt"]): reason for rid, reason, fields in got["dead"]}
    assert set(letters) == {("attacker", "x"), ("victim", "Hijacked"), ("victim", "x"), ("finished", "Again")}
    assert letters[("attacker", "x")] == (
        f"invalid message: result_stream: must be '{prefix}:result:attacker' (the request's own) or absent, "
        f"got '{prefix}:result:victim'"
    )
    owner = f"duplicate: request id 'victim' belongs to message {got['victim_message']}"
    assert letters[("victim", "Hijacked")].startswith(owner)
    assert letters[("victim", "x")].startswith(owner)  # checked before its parameters: no error event either
    assert letters[("finished", "Again")].startswith("duplicate: request id 'finished' belongs to message ")
    # The attacker hears about its own job in its own stream.
    (error,) = got["attacker"]
    assert error.type == "error" and error.error == letters[("attacker", "x")]


def test_one_id_in_two_messages_read_by_two_workers_runs_once_and_a_redelivery_resumes(redis_server, prefix, engine):
    """Two workers each read one of two messages with the same id: the second admitted is a duplicate,
    whichever worker admits it. The first message delivered again (its worker died) is still its own."""
    keys, client = Keys(prefix), redis_server.client()
    reader_a = StreamReader(client, keys, "worker-a", lease_ms=50)
    reader_b = StreamReader(client, keys, "worker-b", lease_ms=50)
    reader_a.ensure_group()
    first = submit(client, keys, "same-id", prompt="First", params=FINISHED)
    (delivery_a,) = reader_a.read_new(1, None)
    second = submit(client, keys, "same-id", prompt="Second", params=FINISHED)
    (delivery_b,) = reader_b.read_new(1, None)
    assert (delivery_a.message_id, delivery_b.message_id) == (first, second)
    admitter_a = Admitter(engine, client, keys, "worker-a", max_deliveries=5, result_ttl_s=60)
    admitter_b = Admitter(engine, client, keys, "worker-b", max_deliveries=5, result_ttl_s=60)

    admitted = admitter_a.admit([delivery_a], set())
    assert [job.message_id for job in admitted.jobs] == [first] and not admitted.batch.dead_letters
    assert client.get(keys.owner("same-id")) == first.encode() and 55 < client.ttl(keys.owner("same-id")) <= 60

    refused = admitter_b.admit([delivery_b], set())  # worker b knows nothing of worker a's job
    assert refused.jobs == [] and refused.batch.events == [] and refused.batch.acks == [second]
    ((letter),) = refused.batch.dead_letters
    assert letter["reason"].startswith(f"duplicate: request id 'same-id' belongs to message {first}")
    assert engine.requests["same-id"].prompt_token_ids == engine.encode("First")

    # Worker a dies holding the first message: worker b claims it once its lease lapses, and admits it.
    engine.abort_request("same-id")
    time.sleep(0.1)
    (claimed,) = reader_b.claim_abandoned(1)
    assert claimed.message_id == first and claimed.delivery_count == 2
    resumed = admitter_b.admit([claimed], set())
    assert [job.message_id for job in resumed.jobs] == [first] and not resumed.batch.dead_letters
    engine.abort_request("same-id")
