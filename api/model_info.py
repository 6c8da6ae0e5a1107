"""What the workers serve (`{prefix}:model`) and which workers are alive (heartbeat keys)."""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis

from api.background_refresh import BackgroundRefresh
from api.errors import SERVER_ERROR, ApiError
from worker.protocol import Keys, ModelInfo, WorkerHeartbeat

# The model key changes only when a worker with another model starts: a short cache spares
# one GET per request.
CACHE_S = 1.0


def served_names(info: ModelInfo, served_model_name: str) -> list[str]:
    """Names a request may use: the configured served name first, then the workers' own."""
    names = [served_model_name] if served_model_name else []
    if info.model not in names:
        names.append(info.model)
    return names


def require_model(info: ModelInfo | None, served_model_name: str, requested: str) -> tuple[ModelInfo, str]:
    """The model info and the name to echo back, or 404 (another model) / 503 (none served yet)."""
    if info is None:
        raise ApiError(
            503,
            "no model is being served yet: no worker has started",
            type=SERVER_ERROR,
            code="no_model",
            headers={"Retry-After": "5"},
        )
    names = served_names(info, served_model_name)
    if requested not in names:
        raise ApiError(
            404,
            f"The model '{requested}' does not exist; this server serves {names}",
            param="model",
            code="model_not_found",
        )
    return info, names[0]


class ModelRegistry:
    def __init__(self, redis: Redis, keys: Keys, served_model_name: str = "") -> None:
        self.redis = redis
        self.keys = keys
        self.served_model_name = served_model_name
        self._info: ModelInfo | None = None
        self._read_at = float("-inf")
        self._refresher = BackgroundRefresh(self._read, "the model record")

    async def info(self) -> ModelInfo | None:
        """The served model's record, read at most every CACHE_S; a known one answers at once while a
        task re-reads it (api/background_refresh.py says why), an unknown one is waited for."""
        if time.monotonic() - self._read_at > CACHE_S:
            if self._info is None:
                await self._read()
            else:
                self._refresher.start()
        return self._info

    async def _read(self) -> None:
        raw = await self.redis.get(self.keys.model)
        try:
            self._info = ModelInfo.from_json(raw) if raw else None
        except (ValueError, TypeError):
            self._info = None
        self._read_at = time.monotonic()

    def names(self, info: ModelInfo) -> list[str]:
        """Names a request may use: the configured served name first, then the workers' own."""
        return served_names(info, self.served_model_name)

    async def require(self, requested: str) -> tuple[ModelInfo, str]:
        """The model info and the name to echo back, or 404 / 503."""
        return require_model(await self.info(), self.served_model_name, requested)

    async def live_workers(self) -> list[WorkerHeartbeat]:
        heartbeats = []
        async for key in self.redis.scan_iter(match=self.keys.worker_pattern, count=100):
            raw = await self.redis.get(key)
            if raw is None:
                continue  # expired between SCAN and GET
            try:
                heartbeats.append(WorkerHeartbeat.from_json(raw))
            except (ValueError, TypeError, json.JSONDecodeError):
                continue
        return heartbeats
