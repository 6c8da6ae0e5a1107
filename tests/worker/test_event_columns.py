"""A step's token events in columns (worker/event_columns.py) from the engine's outputs
(worker/events_from_outputs.py): the numbers and order a result stream needs, across the publisher's pipe and
its merges."""

from __future__ import annotations

import random

from engine.outputs import PromptLogprobs, RequestOutput
from engine.request import Logprob
from tests.worker.harness import read_events
from worker.event_columns import TokenEvents
from worker.event_publisher import Batch, Publisher
from worker.event_publisher_process import _pack, _unpack
from worker.events_from_outputs import events_for_outputs
from worker.job import Job
from worker.protocol import Keys, ResultEvent, encode_event_for_write, encode_token_for_write


def _job(request_id: str, n: int = 1) -> Job:
    return Job(request_id, f"1-{request_id}", f"p:result:{request_id}", f"p:events:{request_id}", n, 10)


def _token(request_id: str, token: int, index: int = 0) -> RequestOutput:
    return RequestOutput(request_id, index, [token], f"t{token}", None, False, None, 10, 1)


def _last(request_id: str, token: int, reason: str, index: int = 0, error: str | None = None) -> RequestOutput:
    tokens, text = ([token], f"t{token}") if token else ([], "")  # token 0: finishing without a new token
    return RequestOutput(request_id, index, tokens, text, None, True, reason, 10, 2, error)


def _written(batch: Batch) -> list[tuple[str, str, int, int, list[int] | None, str]]:
    """(request id, type, index, seq, token ids, stream) of every event, in the order the publisher writes them."""
    rows = []
    for run in batch.segments():
        if isinstance(run, TokenEvents):
            rows += zip(run.request_ids, ["token"] * len(run), run.indexes, run.seqs, run.token_ids, run.streams)
        else:
            rows += [(w.request_id, w.event.type, w.event.index, w.event.seq, w.event.token_ids, w.stream) for w in run]
    return rows


def _seqs(batch: Batch) -> list[tuple[str, str, int, int]]:
    return [row[:4] for row in _written(batch)]


def test_a_choice_that_finishes_beside_one_that_streams_keeps_its_stream_growing() -> None:
    jobs = {"a": _job("a", n=2), "b": _job("b")}
    batch, finished = events_for_outputs(jobs, [_last("a", 5, "stop"), _token("a", 6, index=1), _token("b", 7)], "w")
    assert _seqs(batch) == [("a", "token", 0, 1), ("a", "token", 1, 2), ("b", "token", 0, 1), ("a", "done", 0, 3)]
    assert finished == [] and jobs["a"].done_indices == {0} and jobs["a"].next_seq == 4
    assert [row[4] for row in _written(batch)[:3]] == [[5], [6], [7]]
    assert jobs["a"].completion_tokens == {0: 1, 1: 1}
    batch, finished = events_for_outputs(jobs, [_last("a", 8, "length", index=1)], "w")
    assert _seqs(batch) == [("a", "token", 1, 4), ("a", "done", 1, 5)] and finished == [jobs["a"]]


def test_an_error_ends_every_choice_and_drops_the_tokens_after_it() -> None:
    jobs = {"a": _job("a", n=2)}
    outputs = [_token("a", 5), _last("a", 0, "error", index=1, error="boom"), _token("a", 6)]
    batch, finished = events_for_outputs(jobs, outputs, "w")
    assert _seqs(batch) == [("a", "token", 0, 1), ("a", "error", 0, 2)] and finished == [jobs["a"]]
    assert batch.events[0].event.error == "boom"


def test_a_step_without_tokens_has_no_columns_and_an_empty_one_is_no_batch() -> None:
    jobs = {"a": _job("a")}
    batch, _ = events_for_outputs(jobs, [_last("a", 0, "abort")], "w")
    assert batch.tokens == [] and _seqs(batch) == [("a", "done", 0, 1)]
    assert not events_for_outputs(jobs, [], "w")[0]


def test_the_pipe_and_merges_keep_each_batchs_tokens_before_its_events() -> None:
    jobs = {"a": _job("a", n=2)}
    first, _ = events_for_outputs(jobs, [_last("a", 5, "stop"), _token("a", 6, index=1)], "w")
    second, _ = events_for_outputs(jobs, [_token("a", 7, index=1)], "w")
    first.acks.append("1-a")
    crossed = _unpack(_pack(first))
    assert _seqs(crossed) == _seqs(first) == [("a", "token", 0, 1), ("a", "token", 1, 2), ("a", "done", 0, 3)]
    assert crossed.acks == ["1-a"] and isinstance(crossed.tokens[0][1], TokenEvents)
    crossed.extend(_unpack(_pack(second)))
    assert [seq for *_, seq in _seqs(crossed)] == [1, 2, 3, 4]
    assert [position for position, _ in crossed.tokens] == [0, 1]  # the second step's tokens after the first's done
    assert [type(run).__name__ for run in crossed.segments()] == ["TokenEvents", "list", "TokenEvents"]
    assert all(row[5] == "p:result:a" for row in _written(crossed))


def test_the_column_encoder_writes_the_bytes_of_the_event_encoder() -> None:
    rng = random.Random(0)
    alphabet = ["a", '"', "\\", "é", "\n", "中", " ", "\u2028", "\x00"]
    for _ in range(500):
        seq, index = rng.randrange(1, 10**9), rng.randrange(0, 8)
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
        tokens = [rng.randrange(0, 200_000) for _ in range(rng.randrange(0, 4))]
        worker = rng.choice([None, "w-1", "wö-2"])
        event = ResultEvent(seq, "token", index, text, tokens, None, None, None, None, worker)
        assert encode_token_for_write(seq, index, text, tokens, worker) == encode_event_for_write(event)


def test_merged_steps_reach_redis_in_order_once_with_their_logprobs(redis_server, prefix) -> None:
    keys, client = Keys(prefix), redis_server.client()
    jobs = {"a": Job("a", "1-a", keys.result("a"), keys.events("a"), 2, 10)}
    first, _ = events_for_outputs(jobs, [_last("a", 5, "stop"), _token("a", 6, index=1)], "w")
    logprob = RequestOutput("a", 1, [7], "t7", [Logprob(7, -0.5, {7: -0.5, 8: -1.5})], False, None, 10, 2)
    second, _ = events_for_outputs(jobs, [logprob], "w")
    written: list[tuple[int, int]] = []
    publisher = Publisher(client, keys, "w", 60, lambda request_id: None, lambda n, d: written.append((n, d)))
    merged = _unpack(_pack(first))
    merged.extend(_unpack(_pack(second)))
    publisher.write(merged)
    publisher.write(merged)  # a retry after a lost reply: every id is there already
    events = [event for _, event in read_events(client, keys, "a")]
    assert [(e.seq, e.type, e.index, e.token_ids) for e in events] == [
        (1, "token", 0, [5]), (2, "token", 1, [6]), (3, "done", 0, None), (4, "token", 1, [7])
    ]  # fmt: skip
    assert events[3].logprobs == [{"token_id": 7, "logprob": -0.5, "top": {"7": -0.5, "8": -1.5}}]
    assert written == [(4, 0), (4, 4)]


def test_prompt_logprobs_ride_their_first_token_event_to_redis_and_nothing_else_changes(redis_server, prefix) -> None:
    keys, client = Keys(prefix), redis_server.client()
    jobs = {r: Job(r, f"1-{r}", keys.result(r), keys.events(r), 1, 3) for r in ("a", "b")}
    prompt = PromptLogprobs([5, 6, 7], [Logprob(6, -1.5, {6: -1.5, 9: -0.5}), Logprob(7, -0.25, {})])
    first = RequestOutput("a", 0, [8], "t8", [Logprob(8, -0.5, {})], False, None, 3, 1, prompt_logprobs=prompt)
    batch, _ = events_for_outputs(jobs, [_token("b", 4), first], "w")
    assert batch.tokens[0][1].prompt_logprobs.keys() == {1}  # the column holds only the event that has them
    second, _ = events_for_outputs(jobs, [_token("a", 9), _token("b", 5)], "w")
    merged = _unpack(_pack(batch))
    merged.extend(_unpack(_pack(second)))
    Publisher(client, keys, "w", 60, lambda request_id: None, lambda n, d: None).write(merged)
    a_events = [event for _, event in read_events(client, keys, "a")]
    assert a_events[0].prompt_logprobs == [
        {"token_id": 5, "logprob": None, "top": {}},
        {"token_id": 6, "logprob": -1.5, "top": {"6": -1.5, "9": -0.5}},
        {"token_id": 7, "logprob": -0.25, "top": {}},
    ]
    assert a_events[0].logprobs == [{"token_id": 8, "logprob": -0.5, "top": {}}]
    assert a_events[1].prompt_logprobs is None and a_events[1].token_ids == [9]
    fields = client.xrange(keys.result("b"))[0][1]
    assert b"prompt_logprobs" not in fields and b"logprobs" not in fields  # the plain events' fast path
