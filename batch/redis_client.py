"""The Redis client the Batch API's records go through, for the API (api/batch_services.py), a batch task
(batch/tasks.py) and the sweep (batch/sweep.py): values read as str (the stores compare and parse them as
text), and a connection idle for 30 s checked before it is used again (the sweep sleeps between intervals)."""

from __future__ import annotations

from redis import Redis


def records_client(redis_url: str) -> Redis:
    return Redis.from_url(redis_url, decode_responses=True, health_check_interval=30)
