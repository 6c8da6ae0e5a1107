"""The worker's record of what each engine step did (tests and debugging read it)."""

from __future__ import annotations

from dataclasses import dataclass

STEP_LOG_SIZE = 4096


@dataclass
class StepLog:
    """What one engine step did, kept for tests and debugging (the last STEP_LOG_SIZE steps)."""

    step: int
    time: float
    scheduled: dict[str, int]  # internal request id -> new tokens
    new_request_ids: list[str]  # first scheduled (prefill started) in this step
    num_free_kv_tokens: int
    running_request_ids: list[str]


def parent_id(internal_id: str) -> str:
    return internal_id.split("#", 1)[0]  # the engine runs n > 1 choices as "{id}#{index}"
