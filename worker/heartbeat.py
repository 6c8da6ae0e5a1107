"""Liveness: `{prefix}:worker:{consumer}` is refreshed every second with a short TTL, and the model
the worker serves is published at `{prefix}:model` for the API.

The heartbeat thread reads the loop's last stats snapshot; it never touches the engine.
It also refreshes the queue-depth gauges (the only metrics that need Redis) and, every
TRIM_INTERVAL_S, trims acknowledged messages off the request stream.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import redis

from worker.metrics import WorkerMetrics
from worker.protocol import Keys, ModelInfo, WorkerHeartbeat, tokenizer_fields
from worker.redis_client import CONNECTION_ERRORS

logger = logging.getLogger(__name__)

TRIM_INTERVAL_S = 30.0


def model_record(engine, model_name: str) -> tuple[ModelInfo, dict[str, str]]:
    """The served model's record and its tokenizer's fields, from the engine (publish_model_info writes them)."""
    info = ModelInfo(
        model=model_name,
        max_model_len=engine.max_model_len,
        vocab_size=engine.vocab_size,
        eos_token_ids=sorted(engine.eos_token_ids),
        default_max_tokens=engine.generation_defaults.max_tokens,
    )
    tok = engine.tokenizer
    template, bos, eos = tok.chat_template or "", tok.bos_token or "", tok.eos_token or ""
    return info, tokenizer_fields(tok.backend_tokenizer.to_str(), template, bos, eos)


def publish_model_info(client: redis.Redis, keys: Keys, info: ModelInfo, tokenizer: dict[str, str]) -> None:
    """What API replicas need without the engine: the model's limits and its tokenizer
    (`tokenizer_fields`), written in one transaction so they never disagree."""
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.model, info.to_json())
    pipe.delete(keys.tokenizer)
    pipe.hset(keys.tokenizer, mapping=tokenizer)
    pipe.execute()


class Heartbeat:
    """Args:
    client: Redis client.
    keys: key names.
    snapshot: returns the current WorkerHeartbeat (ts is filled in here).
    interval_s / ttl_s: refresh period and key TTL.
    metrics: gauges refreshed alongside.
    trim: called every TRIM_INTERVAL_S to drop acknowledged requests from the stream (None: never).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        snapshot: Callable[[], WorkerHeartbeat],
        interval_s: float,
        ttl_s: int,
        metrics: WorkerMetrics,
        trim: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.snapshot = snapshot
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.metrics = metrics
        self.trim = trim
        self._next_trim_at = time.monotonic() + TRIM_INTERVAL_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop and delete the key, so the worker disappears from the live set at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        beat = self.snapshot()
        with contextlib.suppress(*CONNECTION_ERRORS):
            self.client.delete(self.keys.worker(beat.consumer))

    def beat(self) -> None:
        beat = self.snapshot()
        beat.ts = time.time()
        self.client.set(self.keys.worker(beat.consumer), beat.to_json(), ex=self.ttl_s)
        for group in self.client.xinfo_groups(self.keys.requests):
            if group["name"].decode() == self.keys.group:
                self.metrics.queue_depth.set(group.get("lag") or 0)
                self.metrics.queue_pending.set(group.get("pending") or 0)
        if self.trim is not None and time.monotonic() >= self._next_trim_at:
            self._next_trim_at = time.monotonic() + TRIM_INTERVAL_S
            self.trim()

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except CONNECTION_ERRORS as exc:
                logger.debug("heartbeat failed: %s", exc)
            except redis.ResponseError as exc:  # e.g. the stream does not exist yet
                logger.debug("heartbeat: %s", exc)
            if self._stop.wait(self.interval_s):
                return
