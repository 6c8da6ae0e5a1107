"""What this worker holds, shared between the engine loop and the lease and publisher threads.

The loop adds and releases message ids; the lease thread renews a snapshot of them. Threads that
find a request taken over by another worker report it here; the loop drops its copy on its next
iteration (the engine is only ever touched by the loop).
"""

from __future__ import annotations

import queue
import threading


class HeldMessages:
    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._lost: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

    def add_new(self, message_ids: list[str]) -> set[str]:
        """Hold the ids not held yet; returns those (a re-read or re-claim of a held one is ignored)."""
        with self._lock:
            fresh = {m for m in message_ids if m not in self._ids}
            self._ids |= fresh
        return fresh

    def release(self, message_ids: list[str]) -> None:
        with self._lock:
            self._ids.difference_update(message_ids)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._ids)

    # ---- losses, reported from other threads -------------------------------------------------
    def report_lost_messages(self, message_ids: list[str]) -> None:
        for message_id in message_ids:
            self._lost.put(("message", message_id))

    def report_lost_request(self, request_id: str) -> None:
        self._lost.put(("request", request_id))

    def drain_lost(self) -> list[tuple[str, str]]:
        """("message", message id) or ("request", request id) pairs reported since the last call."""
        lost = []
        while True:
            try:
                lost.append(self._lost.get_nowait())
            except queue.Empty:
                return lost
