"""Output token ids -> text, a few tokens at a time, with stop strings. Pure Python.

Decoding one token at a time is wrong (a byte-level token may hold half of a
UTF-8 character; a SentencePiece token drops its leading space when decoded
alone), and decoding the whole output every step costs O(output length). So,
as vLLM does, we decode a small window: the last few tokens whose text is
already known plus the new ones, and emit only the characters past what was
already taken from that window.

Two kinds of text are held back:
  1. A trailing U+FFFD: the window ends inside a multi-byte character that the
     next token may complete. It is released when the text ends cleanly, or at
     `flush`.
  2. The longest tail that is still the beginning of some stop string
     (engine/stop_strings.py, shared with the byte-level fast path).

Byte-level BPE tokenizers (GPT-2, Llama 3, Qwen, SmolLM2) take a faster path
that needs no window: engine/byte_level.py. `make_detokenizer` picks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from engine.byte_level import ByteLevelTable, ByteStreamDetokenizer
from engine.stop_strings import StopStringText

# Tokens of already-taken text kept at the start of the window, so the next token
# decodes in context (its leading space, a character it completes).
_CONTEXT_TOKENS = 4
# The longest incomplete UTF-8 sequence is 3 bytes; a byte-fallback decoder shows one
# U+FFFD per byte, a byte-level one a single U+FFFD for all of them. More trailing
# replacement characters than this are invalid bytes that no later token can fix.
_MAX_PENDING_REPLACEMENTS = 3
# A clean window is cut back to _CONTEXT_TOKENS only once it holds this many tokens: cutting
# costs a second decode (the kept tail's text), so cutting at every clean step doubled the
# detokenizer's decode calls; decoding a 16-token window costs about what a 5-token one does.
_CUT_AT_TOKENS = 16
# A window whose text does not end cleanly (a big step that ends inside a character, a run of
# invalid bytes) is cut anyway past this many tokens, so a step stays O(window).
_MAX_WINDOW_TOKENS = 64

_REPLACEMENT_CHAR = "\ufffd"


def _stable_length(text: str) -> int:
    """Length of `text` without the replacement characters that a later token could still change."""
    pending = 0
    while pending < _MAX_PENDING_REPLACEMENTS and pending < len(text) and text[-1 - pending] == _REPLACEMENT_CHAR:
        pending += 1
    return len(text) - pending


class IncrementalDetokenizer(StopStringText):
    """Turns one request's output tokens into text deltas and cuts it at stop strings.

    Args:
        tokenizer: a Hugging Face tokenizer (only `decode` is used).
        context_token_ids: the tokens before the output (the prompt, plus output tokens emitted
            earlier when a request is resumed). Their text is never emitted; the last few only
            give the first output tokens their context.
        stop: strings that end the output; the output never contains them.
        skip_special_tokens: drop special tokens (such as `<|im_end|>`) from the text.

    `add_tokens` returns the text newly safe to emit; `flush` returns what is still held back once
    generation ends. Their concatenation equals `tokenizer.decode(output_ids, skip_special_tokens=...)`
    (cut before the first stop string) whenever the context's text ends on a character boundary; a
    character that the context leaves incomplete (a resumed request) is emitted whole once completed.

    Raises:
        ValueError: a stop string is empty or not a string.
    """

    def __init__(
        self,
        tokenizer: Any,
        context_token_ids: Sequence[int],
        stop: Iterable[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        super().__init__(stop)
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens

        # NOTE: `_window` holds the only token ids kept; `_taken` is how many characters of
        # decode(_window) have already moved on (to `_held` or out). The window is cut back to
        # `_CONTEXT_TOKENS` when its text ends cleanly (past _CUT_AT_TOKENS), so decoding it stays O(window).
        start = max(0, len(context_token_ids) - _CONTEXT_TOKENS)
        # Start the window on a token that begins a character: a window that starts with the tail
        # bytes of one would show a U+FFFD there, and a context of only such tokens would be
        # mistaken below for a character still waiting for its last bytes.
        while (
            start > 0
            and len(context_token_ids) - start < 2 * _CONTEXT_TOKENS
            and self._decode([context_token_ids[start]]).startswith(_REPLACEMENT_CHAR)
        ):
            start -= 1
        self._window: list[int] = list(context_token_ids[start:])
        # A context that ends inside a character (a resumed request whose last emitted token was
        # half of one) leaves that character to be emitted once the output completes it.
        self._taken = _stable_length(self._decode(self._window))

    def add_tokens(self, new_token_ids: Sequence[int]) -> str:
        """Feed the next output tokens.

        Args:
            new_token_ids: tokens generated since the last call (any number, in order).

        Returns:
            The text that is now safe to emit ("" once stopped).
        """
        if self.stopped or not new_token_ids:
            return ""
        self._window.extend(new_token_ids)
        window_text = self._decode(self._window)
        stable = _stable_length(window_text)
        new_text = window_text[self._taken : stable]
        self._taken = max(self._taken, stable)
        is_clean = self._taken == len(window_text)
        if len(self._window) >= _CUT_AT_TOKENS and (is_clean or len(self._window) > _MAX_WINDOW_TOKENS):
            new_text += self._cut_window(window_text)
        delta = self._release(new_text, final=False)
        if self.stopped:
            self._window = []
        return delta

    def add_token(self, token_id: int) -> str:
        """add_tokens([token_id]): the engine's call, once a step for every running request."""
        return self.add_tokens((token_id,))

    def flush(self) -> str:
        """Everything still held back, once generation has finished without a stop string.

        Returns:
            The remaining text, cut before a stop string if one shows up only now.
        """
        if self.stopped:
            return ""
        window_text = self._decode(self._window)
        new_text = window_text[self._taken :]
        self._taken = len(window_text)
        return self._release(new_text, final=True)

    def _cut_window(self, window_text: str) -> str:
        """Keep only the last `_CONTEXT_TOKENS` tokens, their pending replacement characters still pending.

        Returns:
            Text that had to be taken as final to cut the window ("" but for runs of invalid bytes).
        """
        num_pending = len(window_text) - self._taken
        tail = self._window[-_CONTEXT_TOKENS:]
        tail_text = self._decode(tail)
        # NOTE: an incomplete character is at most 3 bytes, so it lies inside the tail and its
        # U+FFFD end the tail's text too. Pending ones the tail does not end with were invalid
        # bytes (final), released now.
        while not tail_text.endswith(_REPLACEMENT_CHAR * num_pending):
            num_pending -= 1
        released = window_text[self._taken : len(window_text) - num_pending]
        self._window = tail
        self._taken = len(tail_text) - num_pending
        return released

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)


def make_detokenizer(
    decoder: Any, context_token_ids: Sequence[int], stop: Iterable[str] = (), skip_special_tokens: bool = True
) -> IncrementalDetokenizer | ByteStreamDetokenizer:
    """The detokenizer for `decoder`: a ByteLevelTable (engine/byte_level.py) streams bytes; anything
    else with a tokenizer's `decode` gets the window. Both emit the same text over a whole output."""
    if isinstance(decoder, ByteLevelTable):
        return ByteStreamDetokenizer(decoder, context_token_ids, stop, skip_special_tokens)
    return IncrementalDetokenizer(decoder, context_token_ids, stop, skip_special_tokens)
