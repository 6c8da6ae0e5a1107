"""A batch's finished lines, each kept once: `{prefix}:batch:lines:{id}` maps a line number to its output or
error line, and the batch's `completed` / `failed` count moves in the same script, only when the line is new.

Whichever runner finishes a line (one that replaced a dead one re-reads the result streams of the lines in
flight), the line is written and counted once; the files are built from these records at the end.
"""

from __future__ import annotations

from redis import Redis

from batch.keys import BatchKeys

# KEYS[1] the batch's lines, KEYS[2] the batch; ARGV line number, line text, counter ('completed' or 'failed').
# NOTE: HSETNX makes a line's record and its count happen once, whichever runner finishes it.
_RECORD_LINE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  return 1
end
return 0
"""


class LineRecords:
    """`redis` must decode responses (str replies)."""

    def __init__(self, redis: Redis, keys: BatchKeys, batch_id: str) -> None:
        self.redis = redis
        self.keys = keys
        self.batch_id = batch_id
        self._record_line = redis.register_script(_RECORD_LINE)

    def record(self, line: int, text: str, succeeded: bool) -> bool:
        """Keep a finished line's output or error line and count it, unless it was recorded before."""
        keys = [self.keys.lines(self.batch_id), self.keys.batch(self.batch_id)]
        return bool(self._record_line(keys=keys, args=[line, text, "completed" if succeeded else "failed"]))

    def all(self) -> dict[int, str]:
        return {int(line): text for line, text in self.redis.hgetall(self.keys.lines(self.batch_id)).items()}

    def numbers(self) -> set[int]:
        return {int(line) for line in self.redis.hkeys(self.keys.lines(self.batch_id))}
