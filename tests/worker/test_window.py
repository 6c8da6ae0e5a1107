"""The batch window's timing: it closes at its end, or once arrivals pause for the gap, or at once
when no more could be read (a hand-driven clock, no Redis)."""

from __future__ import annotations

import pytest

from worker.stream_reader import Delivery
from worker.window import BatchWindow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


def arrival(name: str) -> list[Delivery]:
    return [Delivery(name, {}, 1)]


def test_a_lone_arrival_waits_the_gap_not_the_whole_window():
    clock = Clock()
    window = BatchWindow(8.0, clock=clock)  # gap: a quarter, 2 ms
    window.add(arrival("a"))
    clock.advance_ms(1.9)
    assert not window.is_due(num_free_slots=10)
    assert window.ms_left() == 0  # under 1 ms left: the reads do not block
    clock.advance_ms(0.2)
    assert window.is_due(num_free_slots=10)
    assert [d.message_id for d in window.take()] == ["a"]
    assert not window.is_due(num_free_slots=10) and window.ms_left() == 0


def test_arrivals_that_keep_coming_hold_it_open_until_its_end():
    clock = Clock()
    window = BatchWindow(8.0, clock=clock)
    window.add(arrival("a"))
    for name in "bcdef":  # every 1.5 ms, inside the 2 ms gap
        clock.advance_ms(1.5)
        assert not window.is_due(num_free_slots=10), name
        window.add(arrival(name))
    clock.advance_ms(0.4)  # 7.9 ms after the first, 0.4 ms after the last
    assert not window.is_due(num_free_slots=10)
    clock.advance_ms(0.2)  # 8.1 ms: the window's end has passed, though the gap has not
    assert window.is_due(num_free_slots=10)
    assert len(window.take()) == 6


def test_an_explicit_gap_and_the_block_time_follow_the_nearest_deadline():
    clock = Clock()
    window = BatchWindow(10.0, gap_ms=4.0, clock=clock)
    window.add(arrival("a"))
    assert window.ms_left() == 4
    clock.advance_ms(3.0)
    window.add(arrival("b"))  # the gap restarts; the window's end (10 ms) is still further
    assert window.ms_left() == 4
    clock.advance_ms(3.5)
    window.add(arrival("c"))  # now the window's end (3.5 ms away) comes before the gap's
    assert window.ms_left() == 3
    clock.advance_ms(3.6)
    assert window.is_due(num_free_slots=10)


def test_a_gap_as_long_as_the_window_keeps_the_old_rule():
    clock = Clock()
    window = BatchWindow(5.0, gap_ms=5.0, clock=clock)
    window.add(arrival("a"))
    clock.advance_ms(4.9)
    assert not window.is_due(num_free_slots=10)
    clock.advance_ms(0.2)
    assert window.is_due(num_free_slots=10)


@pytest.mark.parametrize("free", [0, -1])
def test_no_room_admits_at_once(free):
    clock = Clock()
    window = BatchWindow(5.0, clock=clock)
    window.add(arrival("a"))
    assert window.is_due(num_free_slots=free)


def test_removing_the_last_delivery_closes_it():
    clock = Clock()
    window = BatchWindow(5.0, clock=clock)
    window.add(arrival("a"))
    window.remove("a")
    assert len(window) == 0 and window.ms_left() == 0 and not window.is_due(num_free_slots=10)
    window.add(arrival("b"))  # a new first arrival opens a new window
    assert window.ms_left() == 1
