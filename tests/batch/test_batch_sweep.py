"""The sweep (real Redis, real files): expired files and ended batches past retention are deleted, a started
batch whose runner died is sent to the queue again, a waiting or running one is left alone; and the batch
container's healthcheck."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from batch.batch_store import COMPLETED, IN_PROGRESS, VALIDATING, BatchStore
from batch.file_store import BATCH, FileStore
from batch.keys import BatchKeys
from batch.settings import BatchSettings
from batch.sweep import sweep_once
from tests.redis_server import RedisServer


def test_sweep_deletes_what_expired_and_resends_batches_that_lost_their_runner(
    redis_server: RedisServer, prefix: str, tmp_path: Path
) -> None:
    settings = BatchSettings(
        redis_url=redis_server.url, prefix=f"{prefix}sw", files_dir=str(tmp_path), files_ttl_s=3600, batch_lease_s=5
    )
    client = redis_server.client(decode_responses=True)
    keys = BatchKeys(settings.prefix)
    files, store = FileStore(client, keys, tmp_path, settings.files_ttl_s), BatchStore(client, keys)
    kept = files.write("file-kept", "o", "a.jsonl", BATCH, b"{}\n")
    gone = files.write("file-gone", "o", "b.jsonl", BATCH, b"{}\n")
    client.hset(keys.file(gone.id), "expires_at", "1")  # expired long ago
    for batch_id, status in (("batch_old", COMPLETED), ("batch_dead", IN_PROGRESS), ("batch_held", IN_PROGRESS),
                             ("batch_queued", VALIDATING)):  # fmt: skip
        store.create(batch_id, "o", "/v1/completions", kept.id, None)
        client.hset(keys.batch(batch_id), mapping={"status": status, "dispatched_at": "1"})
    client.hset(keys.batch("batch_old"), "created_at", "1")  # ended, and past its retention
    client.set(keys.lease("batch_held"), "runner", px=5000)  # a live runner holds it
    now = time.time()
    # Never started, queued a minute ago: its message waits behind other batches.
    client.hset(keys.batch("batch_queued"), "dispatched_at", str(int(now) - 60))
    dispatched: list[str] = []
    sweep_once(client, settings, dispatched.append, now)
    assert files.get("file-gone") is None and not (tmp_path / "file-gone").exists()
    assert files.get("file-kept") is not None and (tmp_path / "file-kept").exists()
    assert store.get("batch_old") is None and "batch_old" not in store.all_ids()
    assert dispatched == ["batch_dead"]
    # Sent again just now: the next sweep waits two leases before sending it once more.
    sweep_once(client, settings, dispatched.append, now + 1)
    assert dispatched == ["batch_dead"]
    client.close()


def test_the_batch_containers_healthcheck_needs_redis_and_a_writable_files_directory(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    def check(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "batch.healthcheck"], env={**os.environ, **env}, capture_output=True, text=True
        )

    assert check(INFERQ_REDIS_URL=redis_server.url, INFERQ_FILES_DIR=str(tmp_path)).returncode == 0
    down = check(INFERQ_REDIS_URL="redis://127.0.0.1:1/0", INFERQ_FILES_DIR=str(tmp_path))
    assert down.returncode == 1 and "unhealthy: Redis" in down.stderr
    (tmp_path / "file").write_text("")
    blocked = check(INFERQ_REDIS_URL=redis_server.url, INFERQ_FILES_DIR=str(tmp_path / "file" / "sub"))
    assert blocked.returncode == 1 and "files directory" in blocked.stderr
