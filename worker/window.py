"""The batch window: arrivals gathered for up to `batch_window_ms` after the first one, then
admitted together, so their prefills share one engine step (one larger, more efficient forward)
instead of trickling in one per step.

The window also closes once arrivals pause: when nothing new came for `gap_ms` (a quarter of the
window unless set). A lone request at low load then waits the gap, not the whole window, while a
burst, whose arrivals keep coming, still gathers for the whole window (as interrupt coalescing
closes on a count, a timeout or a quiet spell). Decision 0026 has the measurements.

The window never stalls running requests: while it is open the engine keeps decoding, and reads
only block (up to the window's next deadline) when the engine is idle.
"""

from __future__ import annotations

import time

from worker.stream_reader import Delivery

# The gap, as a fraction of the window, when it is not set.
DEFAULT_GAP_FRACTION = 0.25


class BatchWindow:
    """Args:
    window_ms: longest wait after the first arrival.
    gap_ms: the window closes this long after the last arrival (None: a quarter of window_ms).
    clock: seconds, monotonic (tests drive it by hand).
    """

    def __init__(self, window_ms: float, gap_ms: float | None = None, clock=time.monotonic) -> None:
        self._clock = clock
        self.window_s = window_ms / 1000
        self.gap_s = (window_ms * DEFAULT_GAP_FRACTION if gap_ms is None else gap_ms) / 1000
        self.deliveries: list[Delivery] = []
        self.closes_at: float | None = None
        self.last_arrival_at: float | None = None

    def __len__(self) -> int:
        return len(self.deliveries)

    def add(self, deliveries: list[Delivery]) -> None:
        if not deliveries:
            return
        now = self._clock()
        if not self.deliveries:
            self.closes_at = now + self.window_s
        self.last_arrival_at = now
        self.deliveries += deliveries

    def _due_at(self) -> float:
        return min(self.closes_at, self.last_arrival_at + self.gap_s)

    def ms_left(self) -> int:
        """Whole milliseconds until the open window is due (0 when closed, empty or due within 1 ms)."""
        if self.closes_at is None:
            return 0
        return max(0, int((self._due_at() - self._clock()) * 1000))

    def is_due(self, num_free_slots: int) -> bool:
        """Admit now: the window is over, arrivals paused for the gap, or no more could be read anyway."""
        return bool(self.deliveries) and (num_free_slots <= 0 or self._clock() >= self._due_at())

    def take(self) -> list[Delivery]:
        deliveries, self.deliveries = self.deliveries, []
        self.closes_at = self.last_arrival_at = None
        return deliveries

    def remove(self, message_id: str) -> None:
        self.deliveries = [d for d in self.deliveries if d.message_id != message_id]
        if not self.deliveries:
            self.closes_at = self.last_arrival_at = None
