"""Leases: a worker keeps every message it holds fresh so only a dead worker's work is taken over.

A message a live worker holds never looks idle: a thread re-claims it (XCLAIM ... JUSTID, which
resets its idle time without counting a delivery) every lease_ms / 3. A message idle longer than
lease_ms therefore belongs to a worker that died or froze, and `StreamReader.claim_abandoned`
(XAUTOCLAIM) may take it.

Renewal is one Lua script so that checking the owner and re-claiming are atomic: a message
another worker took over while this one was frozen is reported lost, never taken back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from worker.protocol import Keys
from worker.redis_client import CONNECTION_ERRORS, is_nogroup

logger = logging.getLogger(__name__)

# KEYS[1] = request stream; ARGV = group, consumer, message ids. Returns the ids this consumer lost.
RENEW_SCRIPT = """
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('XPENDING', stream, group, id, id, 1)
  if #entry == 1 and entry[1][2] == me then
    redis.call('XCLAIM', stream, group, me, 0, id, 'JUSTID')
  else
    table.insert(lost, id)
  end
end
return lost
"""
MAX_IDS_PER_CALL = 500


class LeaseKeeper:
    """Renews the leases of `held()` every lease_ms / 3 on a thread.

    Args:
        client: Redis client (thread-safe pool).
        keys: key names.
        consumer: this worker's consumer name.
        lease_ms: the lease; others claim messages idle longer than this.
        held: returns a snapshot of the message ids this worker holds (called from the thread).
        on_lost: called from the thread with message ids now owned by someone else (or gone).
        on_renewed: called with the number of leases renewed in each pass (metrics).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        consumer: str,
        lease_ms: int,
        held: Callable[[], list[str]],
        on_lost: Callable[[list[str]], None],
        on_renewed: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.interval_s = lease_ms / 3000
        self.held = held
        self.on_lost = on_lost
        self.on_renewed = on_renewed
        self._script = client.register_script(RENEW_SCRIPT)
        # NOTE: held while a snapshot is renewed. Whoever hands a message off releases it under
        # this lock, so no renewal that still includes it can land after the hand-off.
        self.renew_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferq-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing: whatever is still held becomes claimable after lease_ms."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def renew(self, message_ids: list[str]) -> list[str]:
        """Renew now; returns the ids this worker no longer owns."""
        lost: list[str] = []
        for start in range(0, len(message_ids), MAX_IDS_PER_CALL):
            chunk = message_ids[start : start + MAX_IDS_PER_CALL]
            try:
                result = self._script(keys=[self.keys.requests], args=[self.keys.group, self.consumer, *chunk])
            except redis.ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                # The group is gone (Redis came back empty): nobody holds these messages any more.
                result = chunk
            lost += [r.decode() if isinstance(r, bytes) else r for r in result]
        return lost

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with self.renew_lock:
                    message_ids = self.held()
                    if not message_ids:
                        continue
                    lost = self.renew(message_ids)
                if self.on_renewed is not None:
                    self.on_renewed(len(message_ids) - len(lost))
            except CONNECTION_ERRORS as exc:
                logger.warning("lease renewal failed (%s); retrying in %.2fs", exc, self.interval_s)
                continue
            except Exception:
                logger.exception("lease renewal failed")
                continue
            if lost:
                logger.warning("lost %d message(s) to other workers: %s", len(lost), lost[:5])
                self.on_lost(lost)
