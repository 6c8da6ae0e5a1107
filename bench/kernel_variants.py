"""The Triton kernel variants a process looks up while a `VariantLog` is installed: each one the in-process
cache did not hold (a compile, or a load from Triton's disk cache: ~10-1000 ms inside a step), in order, with
the arguments it specialized (16-byte alignment, a value of 1) and its constexprs.

Used by tests/engine/test_compiles_after_start.py (no variant may be built while serving) and by the service
benchmark's two paths (bench/service_overhead.py, bench/worker_phases.py): the service's first steps had taken
36-46 ms where the offline engine's took ~1 ms (H100, 2026-11-27), a variant met there being one candidate
(none was, in the runs that followed).
"""

from __future__ import annotations

import time


class VariantLog:
    """Install with `with VariantLog() as log:` (the hooks before it come back on exit) or `install()` for the
    rest of the process. `variants` / `seconds`: each variant looked up and its build (or disk-cache load) time."""

    def __init__(self) -> None:
        self.variants: list[str] = []
        self.seconds: list[float] = []
        self._before = None
        self._started = 0.0  # when the variant being built was looked up

    def install(self) -> VariantLog:
        import triton

        runtime = triton.knobs.runtime
        self._before = runtime.jit_cache_hook, runtime.jit_post_compile_hook
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._record, self._built
        return self

    def __enter__(self) -> VariantLog:
        return self.install()

    def __exit__(self, *exc) -> None:
        import triton

        triton.knobs.runtime.jit_cache_hook, triton.knobs.runtime.jit_post_compile_hook = self._before

    def _built(self, **_) -> None:
        self.seconds.append(time.perf_counter() - self._started)

    def _record(self, *, fn, compile: dict, **_) -> None:  # noqa: A002 - Triton's keywords
        names = fn.jit_function.arg_names
        specialized = {names[i[0]]: v for i, v in compile["configs"][0].items()}  # alignment, == 1
        constexprs = {names[i[0]]: v for i, v in compile["constants"].items() if i[0] < len(names)}
        self.variants.append(f"{fn.name} specialized={specialized} constexprs={constexprs}")
        self._started = time.perf_counter()
        # returns None: Triton goes on to compile

    def clear(self) -> None:
        self.variants.clear()
        self.seconds.clear()

    def summary(self) -> dict:
        """How many variants, their seconds, and the first few (for a benchmark's report)."""
        return {"count": len(self.variants), "seconds": sum(self.seconds), "first": self.variants[:10]}
