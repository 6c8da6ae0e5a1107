"""`python -m worker.healthcheck`: exit 0 if a worker in this container (this host name) has a live heartbeat.

The container healthcheck of docker-compose.yml. It runs beside the worker, with the same environment
(INFERQ_REDIS_URL, INFERQ_PREFIX, INFERQ_CONSUMER), and looks for the heartbeat key that the worker
refreshes every second with a short TTL (`{prefix}:worker:{consumer}`, see worker/heartbeat.py):
the key exists only while the worker's loop is alive and reaches Redis.

The consumer name defaults to hostname-pid-random, so without INFERQ_CONSUMER the check matches
`{prefix}:worker:{hostname}-*`: every container has its own host name, so replicas never vouch for
each other. Imports neither torch nor the engine: it runs every few seconds.
"""

from __future__ import annotations

import json
import socket
import sys

import redis

from worker.protocol import Keys, WorkerHeartbeat
from worker.settings import WorkerSettings

TIMEOUT_S = 3.0
_GLOB_SPECIALS = "\\*?[]"


def _escape_glob(text: str) -> str:
    return "".join("\\" + char if char in _GLOB_SPECIALS else char for char in text)


def find_heartbeat(client: redis.Redis, keys: Keys, consumer: str | None, hostname: str) -> WorkerHeartbeat | None:
    """The heartbeat of `consumer`, or of any worker whose consumer name starts with `hostname-`."""
    if consumer:
        candidates = [keys.worker(consumer)]
    else:
        pattern = keys.worker(_escape_glob(hostname) + "-*")
        candidates = list(client.scan_iter(match=pattern, count=1000))
    for key in candidates:
        raw = client.get(key)
        if raw is not None:
            return WorkerHeartbeat.from_json(raw)
    return None


def main(argv: list[str] | None = None) -> int:
    # NOTE: the environment only (no flags): the container's CMD flags are not visible here, so
    # settings a healthcheck needs (Redis URL, prefix, consumer) must be given as INFERQ_* variables.
    settings = WorkerSettings()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    hostname = socket.gethostname()
    try:
        beat = find_heartbeat(client, Keys(settings.prefix), settings.consumer, hostname)
    except redis.RedisError as exc:
        print(f"unhealthy: Redis at {settings.redis_url.split('@')[-1]}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if beat is None:
        who = settings.consumer or f"{hostname}-*"
        print(f"unhealthy: no heartbeat {Keys(settings.prefix).worker(who)} (loading, or stopped)", file=sys.stderr)
        return 1
    print(json.dumps({"consumer": beat.consumer, "model": beat.model, "running": beat.running}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
