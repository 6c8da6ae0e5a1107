"""Listing files and batches for GET /v1/files and GET /v1/batches: one owner's records in creation order,
after a cursor (the id of the last record of the previous page)."""

from __future__ import annotations

from redis import Redis

from batch.batch_store import BatchStore
from batch.file_store import FileRecord, FileStore


def _ids_after(redis: Redis, key: str, after: str | None, newest_first: bool) -> list[str]:
    ids = redis.zrevrange(key, 0, -1) if newest_first else redis.zrange(key, 0, -1)
    if after is not None:
        ids = ids[ids.index(after) + 1 :] if after in ids else []
    return ids


def list_files(
    files: FileStore, owner: str, purpose: str | None, limit: int, after: str | None, newest_first: bool
) -> list[FileRecord]:
    """Up to `limit` of the owner's files (of `purpose` when given), after the file `after`."""
    records = []
    for file_id in _ids_after(files.redis, files.keys.files, after, newest_first):
        record = files.get(file_id, owner)
        if record is not None and (purpose is None or record.purpose == purpose):
            records.append(record)
            if len(records) == limit:
                break
    return records


def list_batches(store: BatchStore, owner: str, limit: int, after: str | None) -> list[dict[str, str]]:
    """Up to `limit` of the owner's batches, newest first, older than the batch `after`."""
    out = []
    for batch_id in _ids_after(store.redis, store.keys.batches, after, newest_first=True):
        fields = store.get(batch_id, owner)
        if fields is not None:
            out.append(fields)
            if len(out) == limit:
                break
    return out
