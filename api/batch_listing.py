"""Listing files and batches for GET /v1/files and GET /v1/batches: one owner's records in creation order,
after a cursor (the id of the last record of the previous page).

A page reads the caller's own index (batch/keys.py's owner_files / owner_batches), from the cursor's rank on,
a chunk of ids at a time: its cost is the page's, not the number of records every owner has. An id whose
record is gone (deleted between the two writes, or swept) is skipped and taken out of the index.
"""

from __future__ import annotations

from collections.abc import Iterator

from redis import Redis

from batch.batch_store import BatchStore
from batch.file_store import FileRecord, FileStore

# ids read from the owner's index at a time: a page of the default size in one read
CHUNK = 64


def _ids_after(redis: Redis, key: str, after: str | None, newest_first: bool) -> Iterator[str]:
    """The index's ids after `after` (none when `after` is not in it), in order, read CHUNK at a time."""
    start = 0
    if after is not None:
        rank = redis.zrevrank(key, after) if newest_first else redis.zrank(key, after)
        if rank is None:
            return
        start = rank + 1
    read = redis.zrevrange if newest_first else redis.zrange
    while ids := read(key, start, start + CHUNK - 1):
        yield from ids
        start += len(ids)


def list_files(
    files: FileStore, owner: str, purpose: str | None, limit: int, after: str | None, newest_first: bool
) -> list[FileRecord]:
    """Up to `limit` of the owner's files (of `purpose` when given), after the file `after`."""
    index = files.keys.owner_files(owner)
    records = []
    for file_id in _ids_after(files.redis, index, after, newest_first):
        record = files.get(file_id, owner)
        if record is None:
            files.redis.zrem(index, file_id)
        elif purpose is None or record.purpose == purpose:
            records.append(record)
            if len(records) == limit:
                break
    return records


def list_batches(store: BatchStore, owner: str, limit: int, after: str | None) -> list[dict[str, str]]:
    """Up to `limit` of the owner's batches, newest first, older than the batch `after`."""
    index = store.keys.owner_batches(owner)
    out = []
    for batch_id in _ids_after(store.redis, index, after, newest_first=True):
        fields = store.get(batch_id, owner)
        if fields is None:
            store.redis.zrem(index, batch_id)
            continue
        out.append(fields)
        if len(out) == limit:
            break
    return out
