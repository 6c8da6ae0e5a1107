"""When Redis answered the worker's step reads, against when they were sent and when the loop waited for them.

Why: on slower H100 hosts the worker's loop waited 0.4-0.8 ms an iteration at full batch for the replies of the
reads it sent while the GPU ran the step (H100, 2026-11-27), although they had ~1.5 ms to come
back. Whether Redis answered late (busy with the publisher's event script of the previous step) or the replies
were there and reading them was slow decides the fix. So every send gets a TIME appended, whose reply is Redis's
clock once it ran the reads (the host's wall clock: Redis runs beside the worker), and the loop's own receive
sees the others' replies only.

Used by bench/worker_phases.py in the service benchmark's worker child; the worker carries no timing code.
"""

from __future__ import annotations

import time


class StepReadsClock:
    """Wraps a DeferredReplies (worker/deferred_replies.py): its `send` gets a trailing TIME, its `receive` drops that
    reply and records (sent, answered by Redis, receive called, receive returned) in host wall-clock seconds."""

    def __init__(self, replies) -> None:
        self._send, self._receive = replies.send, replies.receive
        replies.send, replies.receive = self.send, self.receive
        self._sent_at: float | None = None
        self.records: list[tuple[float, float, float, float]] = []

    def send(self, commands: list[tuple]) -> None:
        if not commands:
            return self._send(commands)
        self._send([*commands, ("TIME",)])
        self._sent_at = time.time()  # after the write returned: the reads were on their way
        return None

    def receive(self) -> list:
        called = time.time()
        replies = self._receive()
        returned = time.time()
        sent_at, self._sent_at = self._sent_at, None
        if sent_at is None or not replies:  # nothing was sent, so no TIME rode along
            return replies
        seconds, micros = (int(v) for v in replies[-1])
        self.records.append((sent_at, seconds + micros / 1e6, called, returned))
        return replies[:-1]

    def clear(self) -> None:
        self.records.clear()

    def summary(self) -> dict:
        """ms means and quantiles: Redis's answer after the send, the loop's wait after the send (its headroom),
        how late Redis answered after the loop started waiting, and the share of sends answered after that."""
        if not self.records:
            return {"sends": 0}
        answered = sorted(1000 * (r[1] - r[0]) for r in self.records)
        headroom = sorted(1000 * (r[2] - r[0]) for r in self.records)
        late = sorted(max(0.0, 1000 * (r[1] - r[2])) for r in self.records)
        waited = sorted(1000 * (r[3] - r[2]) for r in self.records)

        def stats(values: list[float]) -> dict:
            n = len(values)
            return {"mean": sum(values) / n, "p50": values[n // 2], "p90": values[(9 * n) // 10], "max": values[-1]}

        return {
            "sends": len(self.records),
            "answered_after_send_ms": stats(answered),
            "receive_after_send_ms": stats(headroom),
            "answered_after_receive_ms": stats(late),
            "receive_ms": stats(waited),
            "answered_late_share": sum(1 for r in self.records if r[1] > r[2]) / len(self.records),
            # where the mean's tail lies (2026-11-27: a few waits of 20-50 ms carried most of it): the longest
            # receives as (s after the window's first send, receive ms, ms Redis answered after the loop came)
            "longest_receives": [
                (r[0] - self.records[0][0], 1000 * (r[3] - r[2]), max(0.0, 1000 * (r[1] - r[2])))
                for r in sorted(self.records, key=lambda r: r[3] - r[2])[-5:]
            ],
        }


def clock_line(summary: dict | None) -> str:
    """The report's sentence about the step reads' replies (runs before 2026-11-27 13:00 have none)."""
    if not summary or not summary.get("sends"):
        return ""
    a, h = summary["answered_after_send_ms"], summary["receive_after_send_ms"]
    late, wait = summary["answered_after_receive_ms"], summary["receive_ms"]
    return (
        f"The worker's step reads ({summary['sends']} sends, Redis's TIME appended to each): Redis answered "
        f"{a['mean']:.2f} ms after the send (p50 {a['p50']:.2f}, p90 {a['p90']:.2f}, max {a['max']:.2f}); the loop "
        f"came for the replies {h['mean']:.2f} ms after it (p50 {h['p50']:.2f}); "
        f"{100 * summary['answered_late_share']:.0f}% were answered after that (the lateness over all sends: mean "
        f"{late['mean']:.2f} ms, max {late['max']:.2f}); the receive took {wait['mean']:.2f} ms (p50 "
        f"{wait['p50']:.2f}, p90 {wait['p90']:.2f}); the longest receives (s into the run, ms, ms answered late): "
        + ", ".join(f"({t:.2f}, {ms:.1f}, {lag:.1f})" for t, ms, lag in summary.get("longest_receives", []))
        + "."
    )
