"""Requests whose grammar is compiling: held out of the scheduler until it is ready, so a slow compile never
stalls the engine loop or the other requests (GrammarWaitList), and the engine's one compiler and wait list,
built on the first constrained request (ConstrainedAdmission)."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from engine.request import Request
from engine.structured_output.compiler import GrammarCompileService
from engine.structured_output.grammar_state import GrammarState


@dataclass
class _Waiting:
    kind: str
    future: Future
    requests: list[Request]
    since: float = field(default_factory=time.monotonic)


class GrammarWaitList:
    """The engine's requests (every choice of one caller's request together) waiting for their grammar."""

    def __init__(self, service: GrammarCompileService) -> None:
        self.service = service
        self._waiting: list[_Waiting] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, kind: str, future: Future, requests: list[Request]) -> None:
        self._waiting.append(_Waiting(kind, future, requests))

    def poll(self, idle_wait_s: float = 0.0) -> tuple[list[Request], list[tuple[Request, str]]]:
        """(requests now ready, each with its grammar state, replaying any resumed output; (request, error)
        for those whose constraint failed or ran out of time). Requests finished meanwhile (aborted) drop out.

        idle_wait_s: when the engine has nothing else to run, wait up to this long for a compile to end
        rather than spin through empty steps (which would also hold the GIL from the compile threads)."""
        if idle_wait_s > 0 and self._waiting:
            wait([entry.future for entry in self._waiting], timeout=idle_wait_s, return_when=FIRST_COMPLETED)
        ready: list[Request] = []
        failed: list[tuple[Request, str]] = []
        still: list[_Waiting] = []
        now = time.monotonic()
        for entry in self._waiting:
            live = [r for r in entry.requests if not r.is_finished]
            if not live:
                continue
            if not entry.future.done():
                if now - entry.since > self.service.timeout_s:
                    failed += [(r, self.service.timeout_message(entry.kind)) for r in live]
                else:
                    still.append(entry)
                continue
            exc = entry.future.exception()
            if exc is not None:
                failed += [(r, str(exc)) for r in live]
                continue
            for request in live:
                prior = request.prompt_token_ids[len(request.prompt_token_ids) - request.num_prior_output_tokens :]
                try:
                    request.grammar = GrammarState(entry.future.result(), prior)
                except ValueError as state_exc:
                    failed.append((request, str(state_exc)))
                    continue
                ready.append(request)
        self._waiting = still
        return ready, failed


class ConstrainedAdmission:
    """The engine's grammar compiler and wait list, built on the first constrained request (xgrammar's
    tokenizer tables take a second), then kept.

    Args:
        tokenizer, vocab_size, eos_token_ids: what the compiler needs of the model.
        timeout_s: how long a request waits for its grammar (settable until the compiler is built).
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int], timeout_s: float = 10.0) -> None:  # noqa: ANN001
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, eos_token_ids
        self.timeout_s = timeout_s
        self._service: GrammarCompileService | None = None
        self._waiting: GrammarWaitList | None = None

    def __bool__(self) -> bool:
        """Whether any request waits for its grammar."""
        return bool(self._waiting)

    def shutdown(self) -> None:
        """Stops the compiler's threads (where it was built)."""
        if self._service is not None:
            self._service.shutdown()

    def service(self) -> GrammarCompileService:
        if self._service is None:
            self._service = GrammarCompileService(
                self.tokenizer, self.vocab_size, self.eos_token_ids, timeout_s=self.timeout_s
            )
        return self._service

    def submit(self, key: tuple[str, str], requests: list[Request]) -> None:
        """Every choice of one caller's request, held until the grammar of `key` compiled."""
        if self._waiting is None:
            self._waiting = GrammarWaitList(self.service())
        self._waiting.add(key[0], self.service().submit(key), requests)

    def poll(self, idle: bool) -> tuple[list[Request], list[tuple[Request, str]]]:
        """GrammarWaitList.poll; an engine with nothing else to do (idle) waits a few ms for a compile instead
        of spinning."""
        if self._waiting is None:
            return [], []
        return self._waiting.poll(idle_wait_s=0.005 if idle else 0.0)
