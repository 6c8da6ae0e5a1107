"""A request the worker holds: its message, its result stream and the events it owes.

The Job owns the sequence counter of its result stream, so event numbering is decided
here, synchronously, in engine-step order; the publisher only writes what it is handed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from worker.protocol import ResultEvent


@dataclass
class Job:
    """Args:
    request_id: the caller's id (the engine's request id too).
    message_id: the request stream entry this job acknowledges when it ends.
    result_stream / events_channel: where its events go.
    n: number of choices.
    num_prompt_tokens: prompt length, for usage.
    next_seq: the seq of the next event (1 for a fresh request, after the last written one on resume).
    deadline: unix time the request must start by, or None.
    started: the engine scheduled it (or an earlier worker already emitted output).
    skip_indices: choices already done before a resume; the engine regenerates them but their
        output is dropped.
    whole: the message asked for whole choices (wire field `whole`): each choice's output is held here
        (`held`) and written as one token event when the choice ends, not one a step.
    priority: the message's priority (lower runs first); above 0 the job is background work that a request of
        higher priority may preempt (worker/message_intake.py reads ahead for it).
    """

    request_id: str
    message_id: str
    result_stream: str
    events_channel: str
    n: int
    num_prompt_tokens: int
    next_seq: int = 1
    deadline: float | None = None
    started: bool = False
    skip_indices: set[int] = field(default_factory=set)
    done_indices: set[int] = field(default_factory=set)
    completion_tokens: dict[int, int] = field(default_factory=dict)
    admitted_at: float = field(default_factory=time.monotonic)
    whole: bool = False
    held: dict[int, HeldChoice] = field(default_factory=dict)
    priority: int = 0

    @property
    def is_done(self) -> bool:
        return len(self.done_indices | self.skip_indices) >= self.n

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def done_event(self, index: int, finish_reason: str, num_output_tokens: int | None, worker: str) -> ResultEvent:
        """Marks choice `index` done. num_output_tokens (resumed ones included) comes from the engine."""
        self.done_indices.add(index)
        completion = num_output_tokens if num_output_tokens is not None else self.completion_tokens.get(index, 0)
        usage = {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.num_prompt_tokens + completion,
        }
        return ResultEvent(
            seq=self.take_seq(), type="done", index=index, finish_reason=finish_reason, usage=usage, worker=worker
        )

    def error_event(self, message: str, worker: str) -> ResultEvent:
        """An error ends the whole request (every choice)."""
        self.done_indices.update(range(self.n))
        return ResultEvent(seq=self.take_seq(), type="error", error=message, worker=worker)


@dataclass(slots=True)
class HeldChoice:
    """A whole choice's output so far (Job.whole): its text, token ids, their logprobs (JSON, or None when not
    asked for) and the prompt logprobs its first output carried."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    prompt_logprobs: list | None = None

    def add(self, text: str, token_ids: list[int], logprobs: list | None, prompt_logprobs: list | None) -> None:
        self.text.append(text)
        self.token_ids += token_ids
        if logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs += logprobs
        if prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs


def logprobs_to_json(logprobs: list | None) -> list[dict] | None:
    """Engine Logprob objects -> [{token_id, logprob, top: {"id": logprob}}] (JSON keys are strings)."""
    if logprobs is None:
        return None
    return [
        {"token_id": lp.token_id, "logprob": lp.logprob, "top": {str(t): v for t, v in (lp.top or {}).items()}}
        for lp in logprobs
    ]


def prompt_logprobs_to_json(prompt) -> list[dict]:
    """Engine PromptLogprobs -> one entry per prompt token, the first with logprob None (nothing predicts it)."""
    first = {"token_id": prompt.token_ids[0], "logprob": None, "top": {}}
    return [first, *logprobs_to_json(prompt.logprobs)]
