"""Stop strings over a stream of text deltas: what both detokenizers (engine/detokenizer.py's
window over any tokenizer, engine/byte_level.py's byte stream) share once they have new text.

The output ends at the first stop string to complete (the one whose occurrence ends earliest; on
a tie, the one that starts earliest). That is the rule an engine checking after every token
applies, and it makes the result the same however the output is split into steps. The emitted
text ends right before the stop string. The longest tail that is still the beginning of some stop
string is held back, and released as soon as the following text shows it cannot complete one.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopStringText:
    """The emitted text of one output and its stop strings.

    Args:
        stop: strings that end the output; the output never contains them.

    Raises:
        ValueError: a stop string is empty or not a string.
    """

    def __init__(self, stop: Iterable[str] = ()) -> None:
        self._stops: list[str] = []
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
            if s not in self._stops:
                self._stops.append(s)
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._stop_first_chars = frozenset(s[0] for s in self._stops)
        self._held = ""  # decoded text not emitted yet because a stop string may start in it
        self._pieces: list[str] = []  # every emitted delta; joined lazily by `text`
        self.stopped = False
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def _release(self, new_text: str, final: bool) -> str:
        """Append `new_text` to the held text; emit what can no longer be part of a stop string."""
        if not self._stops:
            if new_text:
                self._pieces.append(new_text)
            return new_text
        held = self._held + new_text
        match = self._find_stop(held)
        if match is not None:
            start, stop_string = match
            self.stopped = True
            self.stop_string = stop_string
            self._held = ""
            return self._emit(held[:start])
        keep = 0 if final else self._stop_prefix_tail_length(held)
        self._held = held[len(held) - keep :]
        return self._emit(held[: len(held) - keep])

    def _emit(self, delta: str) -> str:
        if delta:
            self._pieces.append(delta)
        return delta

    def _find_stop(self, held: str) -> tuple[int, str] | None:
        """The stop string whose first occurrence in `held` ends earliest (ties: starts earliest)."""
        # NOTE: emitted text never holds the start of a stop string (see `_stop_prefix_tail_length`),
        # so every occurrence lies wholly inside `held`.
        best: tuple[int, int, str] | None = None
        for s in self._stops:
            start = held.find(s)
            if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
                best = (start + len(s), start, s)
        return None if best is None else (best[1], best[2])

    def _stop_prefix_tail_length(self, held: str) -> int:
        """Length of the longest tail of `held` that some stop string starts with (shorter than it)."""
        for start in range(max(0, len(held) - self._max_stop_len + 1), len(held)):
            if held[start] in self._stop_first_chars:
                tail = held[start:]
                if any(s.startswith(tail) for s in self._stops):
                    return len(held) - start
        return 0
