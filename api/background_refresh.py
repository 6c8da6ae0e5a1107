"""One background refresh at a time, for the API's caches of what the workers publish (the model record,
the tokenizer): a request that finds such a cache stale answers from it and leaves the re-read to a task.

Why: awaiting the re-read made every request of a burst that met a stale cache yield on the event loop before
its XADD, so asyncio ran every other request's parsing first and the first XADD waited for all of them (the
worker's first read came 0.11 s into a 256-request burst on an H100 host, bench/results/h100/session28/).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("inferq.api")


class BackgroundRefresh:
    """Args:
    refresh: re-reads the cache (its errors are logged, and the cache keeps what it had).
    what: the cache's name, for the log.
    """

    def __init__(self, refresh: Callable[[], Awaitable[None]], what: str) -> None:
        self._refresh = refresh
        self._what = what
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Starts a refresh unless one is running."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self._refresh()
        except Exception as exc:  # a failed re-read leaves the cached value; the next stale read retries
            log.warning("refreshing %s failed: %s", self._what, exc)

    async def wait(self) -> None:
        """Until the running refresh (if any) is over (tests, shutdown)."""
        if self._task is not None:
            await asyncio.shield(self._task)
