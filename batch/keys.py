"""Every Redis name of the Batch API, under `{prefix}:batch:` (the ACL grants the batch user that space)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchKeys:
    prefix: str

    @property
    def root(self) -> str:
        return f"{self.prefix}:batch:"

    def file(self, file_id: str) -> str:
        """Hash: one file's record (the OpenAI file object's fields)."""
        return f"{self.root}file:{file_id}"

    @property
    def files(self) -> str:
        """Sorted set: file ids by creation time (listing, sweeping)."""
        return f"{self.root}files"

    def owner_files(self, owner: str) -> str:
        """Sorted set: one owner's file ids by creation time (a page of GET /v1/files reads only these)."""
        return f"{self.root}files-of:{owner}"

    def owner_batches(self, owner: str) -> str:
        """Sorted set: one owner's batch ids by creation time (a page of GET /v1/batches reads only these)."""
        return f"{self.root}batches-of:{owner}"

    def batch(self, batch_id: str) -> str:
        """Hash: one batch's record (the OpenAI batch object's fields) and its counts."""
        return f"{self.root}b:{batch_id}"

    @property
    def batches(self) -> str:
        """Sorted set: batch ids by creation time (cursor pagination, sweeping)."""
        return f"{self.root}batches"

    def lines(self, batch_id: str) -> str:
        """Hash: line number -> its finished output or error line; a line is recorded once (HSETNX)."""
        return f"{self.root}lines:{batch_id}"

    def sent(self, batch_id: str) -> str:
        """Hash: line number -> the meta (JSON) of the request sent for it (set in the transaction of its XADD)."""
        return f"{self.root}sent:{batch_id}"

    def lease(self, batch_id: str) -> str:
        """String: the token of the runner that holds the batch (PX batch_lease_s)."""
        return f"{self.root}lease:{batch_id}"

    @property
    def sweep_lock(self) -> str:
        return f"{self.root}sweep"

    @property
    def celery(self) -> str:
        """Every key of the Celery broker (kombu's global_keyprefix)."""
        return f"{self.root}celery:"
