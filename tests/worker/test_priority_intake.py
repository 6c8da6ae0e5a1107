"""Under the priority policy a worker reads past its free sequence slots (worker/message_intake.py, decision
0062), so an interactive request that arrives behind a backlog of batch lines (priority 1000) starts at the
first free slot: the lines wait in the engine's priority queue, not in the request stream, which is first in,
first out. With max_queued_seqs 0 the same request waits behind every line sent before it."""

from __future__ import annotations

import time

import pytest

from tests.worker.harness import ThreadWorker, assert_exactly_once, make_settings, submit, wait_complete
from worker.protocol import Keys

LINES = [f"line{i}" for i in range(6)]


def _wait_for(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.mark.parametrize("queued", [8, 0])
def test_an_interactive_request_overtakes_the_batch_lines_ahead_of_it(redis_server, prefix, worker_model_dir, queued):
    keys, client = Keys(prefix), redis_server.client()
    settings = make_settings(redis_server, prefix, worker_model_dir, max_num_seqs=2, max_queued_seqs=queued)
    with ThreadWorker(settings) as tw:
        for request_id in LINES:
            submit(client, keys, request_id, prompt_token_ids=[5, 6, 7], priority=1000,
                   params={"max_tokens": 40, "ignore_eos": True})  # fmt: skip
        # the first two lines run; with a queue the other four are read into the engine as well
        _wait_for(lambda: len(tw.worker.jobs) == (len(LINES) if queued else 2), "the lines were not read")
        _wait_for(lambda: all(tw.worker.jobs[r].started for r in LINES[:2] if r in tw.worker.jobs), "no line started")
        submit(client, keys, "interactive", prompt_token_ids=[8, 9], priority=0, params={"max_tokens": 2})
        wait_complete(client, keys, [*LINES, "interactive"])
        starts = [request_id for entry in tw.worker.step_log for request_id in entry.new_request_ids]
    assert sorted(starts) == sorted([*LINES, "interactive"])
    if queued:
        assert starts.index("interactive") == 2, starts  # at the first free slot, ahead of line2..line5
    else:
        assert starts[-1] == "interactive", starts  # read only once every line before it was
    for request_id in [*LINES, "interactive"]:
        assert_exactly_once(client, keys, request_id)
