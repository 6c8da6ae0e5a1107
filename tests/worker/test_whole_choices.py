"""Whole choices (the wire field `whole`, what batch lines ask for): a real worker in a thread, a real private
Redis, the tiny Llama on CPU. Each choice's output comes as one token event when the choice ends, holding exactly
the tokens, text and logprobs the same request streams an event a step; a cancel writes what was held, then the
abort."""

from __future__ import annotations

import time

import pytest

from tests.worker.harness import (
    ThreadWorker,
    assert_exactly_once,
    make_settings,
    offline_outputs,
    read_events,
    request_cancel,
    submit,
    wait_complete,
)
from worker.protocol import Keys

pytestmark = pytest.mark.timeout(120)

PARAMS = {
    "greedy": {"temperature": 0, "max_tokens": 12},
    "seeded-n2": {"temperature": 0.9, "seed": 11, "n": 2, "max_tokens": 9},
    "logprobs": {"temperature": 0, "max_tokens": 7, "logprobs": 2, "prompt_logprobs": 1},
    "min-tokens": {"temperature": 0, "max_tokens": 30, "min_tokens": 3},
}


def _choices(events) -> dict[int, list]:
    by_index: dict[int, list] = {}
    for event in events:
        if event.type == "token":
            by_index.setdefault(event.index, []).append(event)
    return by_index


def test_a_whole_choice_is_one_event_with_what_the_streamed_choice_carries(
    redis_server, prefix, worker_model_dir, engine
):
    keys, client = Keys(prefix), redis_server.client()
    prompt = engine.encode("Whole answers, please: tell me about rivers.")
    expected = offline_outputs(engine, {name: (prompt, params) for name, params in PARAMS.items()})
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        for name, params in PARAMS.items():
            submit(client, keys, f"whole-{name}", prompt_token_ids=prompt, params=params, whole="1")
            submit(client, keys, f"stream-{name}", prompt_token_ids=prompt, params=params)
        ids = [f"{kind}-{name}" for name in PARAMS for kind in ("whole", "stream")]
        results = {rid: wait_complete(client, keys, [rid], n=PARAMS[rid.split("-", 1)[1]].get("n", 1))[rid]
                   for rid in ids}  # fmt: skip

    for name, params in PARAMS.items():
        n = params.get("n", 1)
        whole, streamed = results[f"whole-{name}"], results[f"stream-{name}"]
        assert_exactly_once(client, keys, f"whole-{name}", n=n)
        whole_choices, streamed_choices = _choices(whole), _choices(streamed)
        assert sorted(whole_choices) == list(range(n))
        for index in range(n):
            (event,) = whole_choices[index]  # one token event a choice
            parts = streamed_choices[index]
            assert len(parts) > 1, "the streamed twin came in one event: nothing to compare against"
            assert event.token_ids == expected[name][index] == [t for p in parts for t in p.token_ids], name
            assert event.text == "".join(p.text for p in parts)
            if params.get("logprobs") is not None:
                assert event.logprobs == [lp for p in parts for lp in p.logprobs]
                assert event.prompt_logprobs == parts[0].prompt_logprobs and event.prompt_logprobs
            else:
                assert event.logprobs is None
        whole_done = sorted((e.index, e.finish_reason, e.usage["completion_tokens"]) for e in whole if e.type == "done")
        streamed_done = sorted((e.index, e.finish_reason, e.usage["completion_tokens"]) for e in streamed
                               if e.type == "done")  # fmt: skip
        assert whole_done == streamed_done, name


def test_a_cancelled_whole_choice_writes_what_it_held_then_its_abort(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine) as tw:
        submit(client, keys, "held", prompt_token_ids=[5, 6, 7], params={"max_tokens": 250, "ignore_eos": True},
               whole="1")  # fmt: skip
        deadline = time.monotonic() + 30
        while sum("held" in entry.scheduled for entry in list(tw.worker.step_log)) < 4:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.002)
        assert read_events(client, keys, "held") == []  # nothing is written while the choice runs
        request_cancel(client, keys, "held")
        events = wait_complete(client, keys, ["held"])["held"]
    assert_exactly_once(client, keys, "held")
    assert [e.type for e in events] == ["token", "done"]
    token, done = events
    assert done.finish_reason == "abort"
    assert 3 <= len(token.token_ids) < 250
    assert done.usage["completion_tokens"] == len(token.token_ids)
