"""Engine outputs -> result events. Sequence numbers come from each Job, in the order the events are written."""

from __future__ import annotations

from worker.event_columns import TokenEvents
from worker.event_publisher import Batch, EventWrite
from worker.job import HeldChoice, Job, logprobs_to_json, prompt_logprobs_to_json
from worker.protocol import ResultEvent


def write(job: Job, event) -> EventWrite:
    return EventWrite(job.request_id, job.result_stream, job.events_channel, event)


def events_for_outputs(jobs: dict[str, Job], outputs: list, consumer: str) -> tuple[Batch, list[Job]]:
    """One step's RequestOutputs as the batch of their events: token events in columns (worker/event_columns.py),
    done and error events after them; returns (batch, jobs now complete).

    Sequence numbers follow write order: every token event of the step takes its number before any done or error
    event does (a request of n > 1 choices may finish one and stream another in one step). A token after an
    error of its request in the step's outputs is dropped, as the error ends every choice. Output of a choice
    finished before a resume (skip_indices) is dropped: the engine regenerates it only because it cannot resume
    a subset of choices.

    A whole job's (Job.whole) output is held until its choice ends, then written as one token event just before
    its done event; an error drops what was held (the error ends the request, as it would after streamed tokens).
    """
    tokens = TokenEvents(consumer)
    ends: list = []  # finished outputs, for the done and error events after every token event
    errored: set[str] = set()
    # NOTE: every running request, every step: the columns are appended to inline and each job's sequence number
    # and completion count kept inline (no helper call, no event object here)
    rids, streams, channels, seqs = tokens.request_ids, tokens.streams, tokens.channels, tokens.seqs
    indexes, texts, token_ids, logprobs_of = tokens.indexes, tokens.texts, tokens.token_ids, tokens.logprobs
    for out in outputs:
        job = jobs.get(out.request_id)
        index = out.index
        if job is None or index in job.skip_indices or index in job.done_indices or out.request_id in errored:
            continue
        new_tokens = out.new_token_ids
        if job.whole:
            _hold_or_release(tokens, job, out)
        elif new_tokens or out.new_text:
            completion = job.completion_tokens
            completion[index] = completion.get(index, 0) + len(new_tokens)
            seq = job.next_seq
            job.next_seq = seq + 1
            rids.append(job.request_id)
            streams.append(job.result_stream)
            channels.append(job.events_channel)
            seqs.append(seq)
            indexes.append(index)
            texts.append(out.new_text)
            token_ids.append(list(new_tokens))
            logprobs_of.append(None if out.new_logprobs is None else logprobs_to_json(out.new_logprobs))
            if out.prompt_logprobs is not None:
                tokens.prompt_logprobs[len(seqs) - 1] = prompt_logprobs_to_json(out.prompt_logprobs)
        if out.finished:
            ends.append(out)
            if out.finish_reason == "error":
                errored.add(out.request_id)
    events: list[EventWrite] = []
    finished: list[Job] = []
    for out in ends:
        job = jobs[out.request_id]
        if out.index in job.done_indices:  # an error of the request earlier in this step ended every choice
            continue
        if out.finish_reason == "error":  # terminal for every choice of the request
            events.append(write(job, job.error_event(out.error or "the engine failed this request", consumer)))
        else:
            events.append(write(job, job.done_event(out.index, out.finish_reason, out.num_output_tokens, consumer)))
        if job.is_done:
            finished.append(job)
    return Batch(events=events, tokens=[(0, tokens)] if len(tokens) else []), finished


def _hold_or_release(tokens: TokenEvents, job: Job, out) -> None:  # noqa: ANN001 (engine RequestOutput)
    """A whole job's output: held with its choice's; on the choice's end (not an error), written as one event."""
    index = out.index
    if out.new_token_ids or out.new_text:
        job.completion_tokens[index] = job.completion_tokens.get(index, 0) + len(out.new_token_ids)
        held = job.held.get(index)
        if held is None:
            held = job.held[index] = HeldChoice()
        held.add(
            out.new_text,
            list(out.new_token_ids),
            None if out.new_logprobs is None else logprobs_to_json(out.new_logprobs),
            None if out.prompt_logprobs is None else prompt_logprobs_to_json(out.prompt_logprobs),
        )
    if not out.finished:
        return
    held = job.held.pop(index, None)
    if out.finish_reason == "error":
        job.held.clear()
    elif held is not None:
        tokens.add(job.request_id, job.result_stream, job.events_channel, job.take_seq(), index, "".join(held.text),
                   held.token_ids, held.logprobs, held.prompt_logprobs)  # fmt: skip


def abort_events(job: Job, abort_outputs: list, consumer: str) -> list[EventWrite]:
    """A "done"/"abort" event for every choice still open (engine.abort_request's outputs give the counts); a
    whole job's held output goes out first, as a streamed one would have."""
    counts = {out.index: out.num_output_tokens for out in abort_outputs}
    open_indices = sorted(set(range(job.n)) - job.done_indices - job.skip_indices)
    events = []
    for i in open_indices:
        held = job.held.pop(i, None)
        if held is not None:
            event = ResultEvent(
                seq=job.take_seq(), type="token", index=i, text="".join(held.text), token_ids=held.token_ids,
                logprobs=held.logprobs, worker=consumer, prompt_logprobs=held.prompt_logprobs,
            )  # fmt: skip
            events.append(write(job, event))
        events.append(write(job, job.done_event(i, "abort", counts.get(i), consumer)))
    return events
