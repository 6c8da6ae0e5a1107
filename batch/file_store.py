"""Files of the Batch API: bytes in a directory (INFERQ_FILES_DIR), their records in Redis.

A file's record is a hash of the OpenAI file object's fields plus its owner; the bytes are written to a
temporary name and renamed, so a file whose record exists is always whole. Records are written after
the bytes, and deleted before them: a reader never finds a record without its file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis

from batch.keys import BatchKeys

BATCH = "batch"
BATCH_OUTPUT = "batch_output"


@dataclass(frozen=True)
class FileRecord:
    id: str
    owner: str
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str

    def to_fields(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> FileRecord:
        return cls(
            id=fields["id"],
            owner=fields["owner"],
            bytes=int(fields["bytes"]),
            created_at=int(fields["created_at"]),
            expires_at=int(fields["expires_at"]),
            filename=fields["filename"],
            purpose=fields["purpose"],
        )

    def openai(self) -> dict:
        """The OpenAI file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


class FileStore:
    """Create, read, list and delete files. `redis` must decode responses (str replies)."""

    def __init__(self, redis: Redis, keys: BatchKeys, directory: str | Path, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.directory = Path(directory).expanduser()
        self.ttl_s = ttl_s
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        return self.directory / file_id

    def write(self, file_id: str, owner: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        """Write the bytes, then the record; writing the same id again replaces both (a re-run finalize)."""
        temporary = self.directory / f".{file_id}.{os.getpid()}.tmp"
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path(file_id))
        now = int(time.time())
        record = FileRecord(file_id, owner, len(data), now, now + self.ttl_s, filename, purpose)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.file(file_id), mapping=record.to_fields())
        # NOTE: the score is the creation time in microseconds, exact in a double, unique in practice.
        created = {file_id: time.time_ns() // 1000}
        pipe.zadd(self.keys.files, created)
        pipe.zadd(self.keys.owner_files(owner), created)
        pipe.execute()
        return record

    def get(self, file_id: str, owner: str | None = None) -> FileRecord | None:
        """The record, or None when it does not exist (or belongs to another owner)."""
        fields = self.redis.hgetall(self.keys.file(file_id))
        if not fields:
            return None
        record = FileRecord.from_fields(fields)
        return record if owner is None or record.owner == owner else None

    def read(self, file_id: str) -> bytes:
        return self.path(file_id).read_bytes()

    def delete(self, file_id: str, owner: str | None = None) -> None:
        """Deletes the record, its index entries and its bytes; `owner` where the caller read the record already
        (otherwise it is read here, for the owner's index)."""
        if owner is None:
            owner = self.redis.hget(self.keys.file(file_id), "owner")
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.file(file_id))
        pipe.zrem(self.keys.files, file_id)
        if owner is not None:
            pipe.zrem(self.keys.owner_files(owner), file_id)
        pipe.execute()
        self.path(file_id).unlink(missing_ok=True)

    def expired(self, now: float) -> list[str]:
        """Ids of the files whose expiry has passed."""
        out = []
        for file_id in self.redis.zrange(self.keys.files, 0, -1):
            record = self.get(file_id)
            if record is None or record.expires_at <= now:
                out.append(file_id)
        return out
