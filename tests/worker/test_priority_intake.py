"""Under the priority policy a worker reads past its free sequence slots (worker/message_intake.py), so an
interactive request that arrives behind batch lines (priority 1000) is read before them, which a first-in
first-out stream would not do: with a queue in the engine (max_queued_seqs, decision 0062) it starts at the first
free slot; without one the worker still reads one message past its slots for each batch line it runs, and the
interactive request preempts a line at once (decision 0066). Under fcfs it waits behind every line."""

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


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_an_interactive_request_overtakes_the_batch_lines_ahead_of_it(redis_server, prefix, worker_model_dir, policy):
    keys, client = Keys(prefix), redis_server.client()
    queued = 8 if policy == "priority" else 0  # fcfs ignores the queue: it would only keep lines from other workers
    settings = make_settings(redis_server, prefix, worker_model_dir, max_num_seqs=2, max_queued_seqs=queued,
                             scheduling_policy=policy)  # fmt: skip
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


def _last_step_held(step_log, request_id: str) -> int:
    """The last step after which the worker still held the request (it finished in the step after)."""
    return max(entry.step for entry in step_log if request_id in entry.running_request_ids)


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_with_its_slots_full_of_batch_lines_a_worker_reads_an_interactive_request_and_preempts_a_line(
    redis_server, prefix, worker_model_dir, policy
):
    keys, client = Keys(prefix), redis_server.client()
    settings = make_settings(redis_server, prefix, worker_model_dir, max_num_seqs=2, max_queued_seqs=0,
                             scheduling_policy=policy)  # fmt: skip
    lines = LINES[:3]
    with ThreadWorker(settings) as tw:
        for request_id in lines:
            submit(client, keys, request_id, prompt_token_ids=[5, 6, 7], priority=1000,
                   params={"max_tokens": 120, "ignore_eos": True})  # fmt: skip
        _wait_for(lambda: sum(job.started for job in tw.worker.jobs.values()) == 2, "no line started")
        # under priority the third line is read too, one past the slots for each line running; fcfs leaves it
        held = 3 if policy == "priority" else 2
        _wait_for(lambda: len(tw.worker.jobs) + len(tw.worker.intake.window) == held, "the lines were not read")
        assert len(tw.worker.jobs) + len(tw.worker.intake.window) == held
        submit(client, keys, "interactive", prompt_token_ids=[8, 9], priority=0, params={"max_tokens": 2})
        wait_complete(client, keys, [*lines, "interactive"])
        step_log = list(tw.worker.step_log)
    starts = [request_id for entry in step_log for request_id in entry.new_request_ids]
    for request_id in [*lines, "interactive"]:
        assert_exactly_once(client, keys, request_id)
    first_line_done = min(_last_step_held(step_log, request_id) for request_id in lines)
    if policy == "priority":
        assert starts.index("interactive") == 2, starts  # ahead of line2, which was read before it
        assert _last_step_held(step_log, "interactive") < first_line_done  # it took a running line's slot
    else:
        assert starts[-1] == "interactive", starts
        assert _last_step_held(step_log, "interactive") > first_line_done
