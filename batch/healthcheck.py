"""`python -m batch.healthcheck`: the batch container's HEALTHCHECK. Healthy when Redis answers as the batch
user (PING) and the files directory takes a write; exit 1 with the reason otherwise."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import redis

from batch.settings import BatchSettings


def main() -> int:
    settings = BatchSettings()
    try:
        with redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        print(f"unhealthy: Redis: {type(exc).__name__}", file=sys.stderr)
        return 1
    directory = Path(settings.files_dir).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".health-"):
            pass
    except OSError as exc:
        print(f"unhealthy: files directory {directory}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
