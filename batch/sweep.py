"""The periodic sweep of the batch workers (a thread in each; a Redis lock makes one sweep per interval).

- Files past their expiry are deleted (record, then bytes).
- Batches past their retention (files_ttl_s after creation, once ended) are deleted.
- A batch that started (in_progress, cancelling, finalizing) holds its lease until it ends: one whose lease
  lapsed has lost its runner (its worker died) and is sent to the queue again (at most once per two leases).
  A batch still validating has never started: its message waits in the queue behind others, and only the
  broker's visibility timeout brings back a message its worker lost. A second run of the same batch finds
  it held or ended and returns.

Why not Celery beat: beat is one more process to run exactly once per deployment; the sweep runs in every
batch worker and needs nothing but the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis import Redis

from batch.batch_store import TERMINAL, VALIDATING, BatchStore
from batch.celery_app import VISIBILITY_TIMEOUT_S
from batch.file_store import FileStore
from batch.keys import BatchKeys
from batch.redis_client import records_client
from batch.settings import BatchSettings

log = logging.getLogger("inferq.batch")


def idle_s_of(record: dict[str, str], now: float) -> float:
    """Seconds since the batch was last sent to the queue."""
    return now - int(record.get("dispatched_at") or 0)


def sweep_once(redis: Redis, settings: BatchSettings, dispatch: Callable[[str], None], now: float) -> None:
    keys = BatchKeys(settings.prefix)
    files = FileStore(redis, keys, settings.files_dir, settings.files_ttl_s)
    store = BatchStore(redis, keys)
    for file_id in files.expired(now):
        files.delete(file_id)
    for batch_id in store.all_ids():
        record = store.get(batch_id)
        if record is None:
            redis.zrem(keys.batches, batch_id)
            continue
        if record["status"] in TERMINAL:
            if int(record["created_at"]) + settings.files_ttl_s <= now:
                store.delete(batch_id)
            continue
        if record["status"] == VALIDATING and idle_s_of(record, now) < VISIBILITY_TIMEOUT_S:
            continue  # never started: its message still waits in the queue
        if idle_s_of(record, now) > 2 * settings.batch_lease_s and not redis.exists(keys.lease(batch_id)):
            log.warning("batch %s has no runner: sent to the queue again", batch_id)
            store.mark_dispatched(batch_id)
            dispatch(batch_id)


def index_by_owner(redis: Redis, keys: BatchKeys) -> int:
    """Puts records made before the per-owner indexes existed (batch/keys.py's owner_files, owner_batches) into
    them, under their creation score; ZADD NX leaves a record already there as it is. Returns how many it added.
    Each batch worker runs it once as it starts, so listings find records older than the indexes."""
    added = 0
    for index, record_key, owner_index in ((keys.files, keys.file, keys.owner_files),
                                           (keys.batches, keys.batch, keys.owner_batches)):  # fmt: skip
        for item_id, score in redis.zrange(index, 0, -1, withscores=True):
            owner = redis.hget(record_key(item_id), "owner")
            if owner is not None:
                added += redis.zadd(owner_index(owner), {item_id: score}, nx=True)
    return added


class Sweeper:
    """A daemon thread that sweeps every `batch_sweep_interval_s` when it wins the lock."""

    def __init__(self, settings: BatchSettings, dispatch: Callable[[str], None]) -> None:
        self.settings = settings
        self.dispatch = dispatch
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="batch-sweep", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        interval = self.settings.batch_sweep_interval_s
        redis = records_client(self.settings.redis_url)
        keys = BatchKeys(self.settings.prefix)
        lock = keys.sweep_lock
        try:
            if added := index_by_owner(redis, keys):
                log.info("indexed %d older files and batches by owner", added)
        except Exception:  # Redis away: listings miss the older records until a restart runs it again
            log.exception("indexing files and batches by owner failed")
        while not self._stop.wait(interval):
            try:
                if redis.set(lock, "1", nx=True, px=max(1, int(interval * 1000 * 0.9))):
                    sweep_once(redis, self.settings, self.dispatch, time.time())
            except Exception:  # Redis away: the next interval tries again
                log.exception("batch sweep failed")
        redis.close()
