"""Batches' records in Redis: one hash per batch (the OpenAI batch object's fields, its counts, its owner).

Status moves only forward: validating -> in_progress -> finalizing -> completed | failed | expired, and
validating | in_progress -> cancelling -> cancelled (a script checks the current status, so a cancel and a
runner's step never overwrite each other). Counts move with the lines' records (batch/line_records.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

from redis import Redis

from batch.keys import BatchKeys

VALIDATING = "validating"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
FAILED = "failed"
EXPIRED = "expired"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
TERMINAL = (COMPLETED, FAILED, EXPIRED, CANCELLED)
COMPLETION_WINDOW = "24h"
WINDOW_S = 24 * 3600

_TIMESTAMPS = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)

# KEYS[1] the batch; ARGV[1] the allowed current statuses (space-separated), ARGV[2..] field, value pairs.
# Returns 1 when the fields were written.
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
for allowed in string.gmatch(ARGV[1], '%S+') do
  if allowed == status then
    redis.call('HSET', KEYS[1], unpack(ARGV, 2))
    return 1
  end
end
return 0
"""


def openai_batch(fields: dict[str, str]) -> dict[str, Any]:
    """A record's hash -> the OpenAI batch object."""
    out: dict[str, Any] = {
        "id": fields["id"],
        "object": "batch",
        "endpoint": fields["endpoint"],
        "errors": json.loads(fields["errors"]) if fields.get("errors") else None,
        "input_file_id": fields["input_file_id"],
        "completion_window": fields["completion_window"],
        "status": fields["status"],
        "output_file_id": fields.get("output_file_id") or None,
        "error_file_id": fields.get("error_file_id") or None,
    }
    for name in _TIMESTAMPS:
        out[name] = int(fields[name]) if fields.get(name) else None
    out["request_counts"] = {
        "total": int(fields.get("total", 0)),
        "completed": int(fields.get("completed", 0)),
        "failed": int(fields.get("failed", 0)),
    }
    out["metadata"] = json.loads(fields["metadata"]) if fields.get("metadata") else None
    return out


class BatchStore:
    """`redis` must decode responses (str replies)."""

    def __init__(self, redis: Redis, keys: BatchKeys) -> None:
        self.redis = redis
        self.keys = keys
        self._transition = redis.register_script(_TRANSITION)

    def create(
        self, batch_id: str, owner: str, endpoint: str, input_file_id: str, metadata: dict[str, str] | None
    ) -> dict[str, str]:
        now = int(time.time())
        fields = {
            "id": batch_id,
            "owner": owner,
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": COMPLETION_WINDOW,
            "status": VALIDATING,
            "created_at": str(now),
            "expires_at": str(now + WINDOW_S),
            "dispatched_at": str(now),
            "metadata": json.dumps(metadata) if metadata is not None else "",
            "total": "0",
            "completed": "0",
            "failed": "0",
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.batch(batch_id), mapping=fields)
        created = {batch_id: time.time_ns() // 1000}
        pipe.zadd(self.keys.batches, created)
        pipe.zadd(self.keys.owner_batches(owner), created)
        pipe.execute()
        return fields

    def get(self, batch_id: str, owner: str | None = None) -> dict[str, str] | None:
        fields = self.redis.hgetall(self.keys.batch(batch_id))
        if not fields or "id" not in fields:
            return None
        return fields if owner is None or fields.get("owner") == owner else None

    def all_ids(self) -> list[str]:
        return self.redis.zrange(self.keys.batches, 0, -1)

    def transition(self, batch_id: str, allowed: tuple[str, ...], **fields: Any) -> bool:
        """Write the fields when the status is one of `allowed`; True when written."""
        args = [" ".join(allowed)]
        for name, value in fields.items():
            args += [name, value if isinstance(value, str) else json.dumps(value)]
        return bool(self._transition(keys=[self.keys.batch(batch_id)], args=args))

    def mark_dispatched(self, batch_id: str) -> None:
        self.redis.hset(self.keys.batch(batch_id), "dispatched_at", str(int(time.time())))

    def delete(self, batch_id: str) -> None:
        owner = self.redis.hget(self.keys.batch(batch_id), "owner")
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.batch(batch_id), self.keys.lines(batch_id), self.keys.sent(batch_id))
        pipe.delete(self.keys.lease(batch_id))
        pipe.zrem(self.keys.batches, batch_id)
        if owner is not None:
            pipe.zrem(self.keys.owner_batches(owner), batch_id)
        pipe.execute()
