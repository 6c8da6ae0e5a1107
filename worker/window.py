"""The batch window: arrivals gathered for up to `batch_window_ms` after the first one, then
admitted together, so their prefills share one engine step (one larger, more efficient forward)
instead of trickling in one per step.

The window never stalls running requests: while it is open the engine keeps decoding, and reads
only block (up to the window's end) when the engine is idle.
"""

from __future__ import annotations

import time

from worker.intake import Delivery


class BatchWindow:
    def __init__(self, window_ms: float) -> None:
        self.window_s = window_ms / 1000
        self.deliveries: list[Delivery] = []
        self.closes_at: float | None = None

    def __len__(self) -> int:
        return len(self.deliveries)

    def add(self, deliveries: list[Delivery]) -> None:
        if deliveries and not self.deliveries:
            self.closes_at = time.monotonic() + self.window_s
        self.deliveries += deliveries

    def ms_left(self) -> int:
        """Milliseconds until the open window closes (0 when closed or empty)."""
        if self.closes_at is None:
            return 0
        return max(0, int((self.closes_at - time.monotonic()) * 1000))

    def is_due(self, num_free_slots: int) -> bool:
        """Admit now: the window is over, or no more could be read anyway."""
        return bool(self.deliveries) and (num_free_slots <= 0 or time.monotonic() >= self.closes_at)

    def take(self) -> list[Delivery]:
        deliveries, self.deliveries, self.closes_at = self.deliveries, [], None
        return deliveries

    def remove(self, message_id: str) -> None:
        self.deliveries = [d for d in self.deliveries if d.message_id != message_id]
        if not self.deliveries:
            self.closes_at = None
