"""The engine's table of live requests: every request from `add_request` until its final output.

LLMEngine adds to it; its OutputProcessor reads it every step and forgets a request once it has finished.
Both hold the same object, so neither reaches into the other's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.byte_level import ByteStreamDetokenizer
from engine.detokenizer import IncrementalDetokenizer
from engine.request import Request


@dataclass(slots=True)
class LiveRequests:
    """The live requests and what each needs until it finishes.

    Attributes:
        requests: internal id -> request (a choice of an n > 1 request has the id "{id}#{index}").
        children: the caller's id -> the internal ids of its choices.
        detokenizers: internal id -> its detokenizer.
        sync_ids: requests whose sampling reads their earlier tokens on the host (penalties): while any
            runs, the engine's steps are synchronous.
        prompt_logprob_ids: requests whose prefill computes prompt logprobs (engine/prompt_logprobs.py):
            while any runs, the runner looks for their chunks in each step.
    """

    requests: dict[str, Request] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    detokenizers: dict[str, IncrementalDetokenizer | ByteStreamDetokenizer] = field(default_factory=dict)
    sync_ids: set[str] = field(default_factory=set)
    prompt_logprob_ids: set[str] = field(default_factory=set)

    def add(
        self,
        request: Request,
        detokenizer: IncrementalDetokenizer | ByteStreamDetokenizer,
        *,
        reads_history: bool,
    ) -> None:
        """One choice of a request; the caller records the caller's id's choices in `children`."""
        request_id = request.request_id
        self.requests[request_id] = request
        self.detokenizers[request_id] = detokenizer
        if reads_history:
            self.sync_ids.add(request_id)
        if request.prompt_logprobs is not None:
            self.prompt_logprob_ids.add(request_id)

    def forget(self, request: Request) -> None:
        """A finished choice; its caller's id goes once none of its choices is live."""
        request_id = request.request_id
        self.requests.pop(request_id, None)
        self.detokenizers.pop(request_id, None)
        self.sync_ids.discard(request_id)
        self.prompt_logprob_ids.discard(request_id)
        parent = request.parent_id or request_id
        siblings = self.children.get(parent, [])
        if all(sid not in self.requests for sid in siblings):
            self.children.pop(parent, None)
