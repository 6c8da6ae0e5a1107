"""Triton kernel variants a benchmarked process looks up while it is timed: each one the in-process cache did
not hold (a compile, or a load from Triton's disk cache: ~10-1000 ms inside a step).

Why: the service's first steps took 36-46 ms of runner host time in 1-3 one-sequence steps where the offline
engine's took ~1 ms (bench/results/h100/session27/); a variant met there is one candidate, and
tests/engine/test_compiles_after_start.py checks only the engine's own varied steps on the GPU.
"""

from __future__ import annotations

import time


class VariantLog:
    """Installs Triton's jit_cache_hook / jit_post_compile_hook (no-op without triton); `summary()` gives how
    many variants were looked up since start or `clear()`, their seconds, and the first few's names."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.seconds = 0.0
        self._started: float | None = None
        try:
            import triton
        except ImportError:
            return
        runtime = triton.knobs.runtime
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._looked_up, self._built

    def _looked_up(self, *, fn, **_) -> None:
        self.names.append(fn.name)
        self._started = time.perf_counter()
        # returns None: Triton goes on to build (or load) the variant

    def _built(self, **_) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def clear(self) -> None:
        self.names.clear()
        self.seconds = 0.0

    def summary(self) -> dict:
        return {"count": len(self.names), "seconds": self.seconds, "first": self.names[:10]}
