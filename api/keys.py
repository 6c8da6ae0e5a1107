"""Redis names the API uses beyond the wire contract's (`worker.protocol.Keys`).

Everything the API keeps lives in Redis, never in process memory, so that any
replica can resume, cancel or deduplicate any request.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from worker.protocol import Keys


@dataclass(frozen=True)
class ApiKeys:
    prefix: str

    @cached_property
    def wire(self) -> Keys:
        return Keys(self.prefix)

    def meta(self, request_id: str) -> str:
        """Hash: owner, kind, model, created, n, include_usage, logprobs (to resume anywhere)."""
        return f"{self.prefix}:api:req:{request_id}"

    def attached(self, request_id: str) -> str:
        """Counter of clients attached to a request's stream, across replicas."""
        return f"{self.prefix}:api:attached:{request_id}"

    def idempotency(self, owner: str, key_digest: str) -> str:
        return f"{self.prefix}:api:idem:{owner}:{key_digest}"

    @property
    def queue(self) -> str:
        """Sorted set of admitted, not yet started request ids (score: admission time)."""
        return f"{self.prefix}:api:queue"

    @property
    def queue_tokens(self) -> str:
        """Hash request id -> prompt tokens of the admitted, not yet started requests."""
        return f"{self.prefix}:api:queue:tokens"

    @property
    def queue_owners(self) -> str:
        """Hash request id -> owner (the caller's key digest) of the admitted, not yet started requests."""
        return f"{self.prefix}:api:queue:owners"

    def rate(self, owner: str, window: int, kind: str) -> str:
        return f"{self.prefix}:api:rate:{owner}:{window}:{kind}"
