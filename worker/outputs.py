"""Engine outputs -> result events. Sequence numbers come from each Job, in step order."""

from __future__ import annotations

from worker.job import Job, logprobs_to_json
from worker.publisher import EventWrite


def write(job: Job, event) -> EventWrite:
    return EventWrite(job.request_id, job.result_stream, job.events_channel, event)


def events_for_outputs(jobs: dict[str, Job], outputs: list, consumer: str) -> tuple[list[EventWrite], list[Job]]:
    """Token, done and error events of one step's RequestOutputs; returns (events, jobs now complete).

    Output of a choice finished before a resume (skip_indices) is dropped: the engine regenerates
    it only because it cannot resume a subset of choices.
    """
    events: list[EventWrite] = []
    finished: list[Job] = []
    for out in outputs:  # NOTE: every running request, every step: kept lean (no helper calls when avoidable)
        job = jobs.get(out.request_id)
        index = out.index
        if job is None or index in job.skip_indices or index in job.done_indices:
            continue
        if out.new_token_ids or out.new_text:
            logprobs = None if out.new_logprobs is None else logprobs_to_json(out.new_logprobs)
            event = job.token_event(index, out.new_token_ids, out.new_text, logprobs, consumer)
            events.append(EventWrite(job.request_id, job.result_stream, job.events_channel, event))
        if not out.finished:
            continue
        if out.finish_reason == "error":  # terminal for every choice of the request
            events.append(write(job, job.error_event(out.error or "the engine failed this request", consumer)))
        else:
            events.append(write(job, job.done_event(out.index, out.finish_reason, out.num_output_tokens, consumer)))
        if job.is_done:
            finished.append(job)
    return events, finished


def abort_events(job: Job, abort_outputs: list, consumer: str) -> list[EventWrite]:
    """A "done"/"abort" event for every choice still open (engine.abort_request's outputs give the counts)."""
    counts = {out.index: out.num_output_tokens for out in abort_outputs}
    open_indices = sorted(set(range(job.n)) - job.done_indices - job.skip_indices)
    return [write(job, job.done_event(i, "abort", counts.get(i), consumer)) for i in open_indices]
