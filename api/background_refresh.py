"""One background refresh at a time, for the API's caches of what the workers publish (the model record,
the tokenizer): a request that finds such a cache stale answers from it and leaves the re-read to a task.

Why: awaiting the re-read made every request of a burst that met a stale cache yield on the event loop before
its Redis part, so asyncio ran every other request's parsing first, and the first request's enqueue started
after the last one's handler. Its XADD still waits behind the SUBSCRIBE's round trip, during which the others
parse (decision 0028).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("inferq.api")


class BackgroundRefresh:
    """Args:
    refresh: re-reads the cache, from start()'s arguments (its errors are logged; the cache keeps what it had).
    what: the cache's name, for the log.
    """

    def __init__(self, refresh: Callable[..., Awaitable[object]], what: str) -> None:
        self._refresh = refresh
        self._what = what
        self._task: asyncio.Task | None = None

    def start(self, *args: object) -> None:
        """Starts refresh(*args) unless a refresh is running."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(args))

    async def _run(self, args: tuple) -> None:
        try:
            await self._refresh(*args)
        except Exception as exc:  # a failed re-read leaves the cached value; the next stale read retries
            log.warning("refreshing %s failed: %s", self._what, exc)

    async def wait(self) -> None:
        """Until the running refresh (if any) is over (the tests read what it left)."""
        if self._task is not None:
            await asyncio.shield(self._task)
