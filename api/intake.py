"""This replica's requests on their way to the admission script: body read, script not answered yet.

The admission gate (api/admission_gate.py) counts them with the queue, so that a burst reaching an
empty queue is cut at the cap before its requests are parsed, validated and tokenized, not after:
all of a burst's headers arrive before the first of its requests is admitted. A request's ticket
closes when the admission script answers it (api/admission.py), or when the request ends without
reaching the script (bad input, a rate limit, an earlier request with its Idempotency-Key).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class IntakeTicket:
    """One request's place in its replica's intake; closing it twice counts once."""

    __slots__ = ("_intake", "_open")

    def __init__(self, intake: Intake) -> None:
        self._intake = intake
        self._open = True
        intake.count += 1

    def close(self) -> None:
        if self._open:
            self._open = False
            self._intake.count -= 1


class Intake:
    """How many requests of this replica hold a ticket."""

    def __init__(self) -> None:
        self.count = 0


# NOTE: the ticket of the request the current task serves; the route and the admission script run in that
# task (or tasks it started, which copy the variable), so the script's caller closes the gate's ticket.
_ticket: ContextVar[IntakeTicket | None] = ContextVar("inferq_intake_ticket", default=None)


@contextmanager
def holding_ticket(intake: Intake) -> Iterator[None]:
    """A ticket for the request served inside the block, closed at its end if the script has not closed it."""
    ticket = IntakeTicket(intake)
    token = _ticket.set(ticket)
    try:
        yield
    finally:
        ticket.close()
        _ticket.reset(token)


def admission_answered() -> None:
    """The admission script answered this task's request (admitted: it counts in the queue now; or refused)."""
    ticket = _ticket.get()
    if ticket is not None:
        ticket.close()
