"""inferq's inference engine: models, weights, paged KV cache, scheduler, sampler.

Synchronous and framework-free at its edges: it never imports redis, fastapi,
asyncio, worker or api. Public names are loaded lazily, so importing a pure
module (scheduler, block manager, request) does not load torch or the models.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "engine.llm",
    "CompletionOutput": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "CacheConfig": "engine.config",
    "EngineConfig": "engine.config",
    "ModelConfig": "engine.config",
    "SchedulerConfig": "engine.config",
    "SpeculativeConfig": "engine.config",
    "EngineStats": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
