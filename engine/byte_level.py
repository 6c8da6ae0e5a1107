"""Detokenizing byte-level BPE (GPT-2, Llama 3, Qwen2/3, SmolLM2) without calling the tokenizer.

A byte-level BPE token stands for a fixed run of bytes, and decoding an output is UTF-8
decoding of their concatenation (invalid bytes shown as U+FFFD). So once each token's bytes
are in a table, an output can be decoded as a byte stream: a C incremental UTF-8 decoder
holds back a character that is still missing bytes, and no window of earlier tokens is
decoded again (engine/detokenizer.py's generic path must, for tokenizers whose decoders look
at neighbouring tokens). At full batch re-decoding those windows was the largest piece of the
engine's per-step host work (decision 0022).

`byte_level_table` builds the table only where it gives exactly the tokenizer's own text: a
Rust-backed transformers tokenizer whose decoder is ByteLevel, whose decode is not overridden
and has no clean-up step, and whose decode of the whole vocabulary in one call equals the
table's. Anything else gets None, and the engine keeps the generic path.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.stop_strings import StopStringText

# A character still missing bytes is at most 3 bytes long (the first 3 of a 4-byte one); the
# context's last tokens holding this many bytes hold its start.
_PENDING_BYTES = 4


@dataclass(frozen=True)
class ByteLevelTable:
    """Each token id's bytes, with and without special tokens (index = token id).

    Ids past the table (a model whose embedding is padded past the tokenizer's vocabulary) decode
    to nothing, as in the Rust tokenizer.
    """

    keep: list[bytes]
    skip: list[bytes]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return _join(self.skip if skip_special_tokens else self.keep, token_ids).decode("utf-8", "replace")


def _join(table: list[bytes], token_ids: Sequence[int]) -> bytes:
    try:
        return b"".join([table[t] for t in token_ids])
    except IndexError:
        return b"".join([table[t] if t < len(table) else b"" for t in token_ids])


def _byte_level_chars() -> dict[int, int]:
    """GPT-2's byte -> printable character map, inverted: ord(character) -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {b: b for b in printable} | {b: 256 + i for i, b in enumerate(shifted)}
    return {c: b for b, c in chars.items()}


def byte_level_table(tokenizer: Any) -> ByteLevelTable | None:
    """The table for a byte-level BPE tokenizer, or None where it would not give the tokenizer's text."""
    try:
        from tokenizers.decoders import ByteLevel
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout
        return None
    if not (
        isinstance(tokenizer, TokenizersBackend)
        and type(tokenizer).decode is PreTrainedTokenizerBase.decode
        and type(tokenizer)._decode is TokenizersBackend._decode
        and not tokenizer.clean_up_tokenization_spaces
        and isinstance(tokenizer._tokenizer.decoder, ByteLevel)
    ):
        return None
    backend = tokenizer._tokenizer
    vocab = backend.get_vocab(with_added_tokens=True)
    chars = _byte_level_chars()
    keep = [b""] * (max(vocab.values()) + 1)
    for token, token_id in vocab.items():
        # The ByteLevel decoder maps a token's characters to bytes, or takes its UTF-8 as it is
        # when a character lies outside the map (an added token such as "<think>" is inside it).
        if all(ord(c) in chars for c in token):
            keep[token_id] = bytes([chars[ord(c)] for c in token])
        else:
            keep[token_id] = token.encode()
    special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    skip = list(keep)
    for token in special:
        skip[vocab[token]] = b""
    table = ByteLevelTable(keep, skip)
    every_id = list(range(len(keep)))
    for skip_special in (False, True):
        if backend.decode(every_id, skip_special_tokens=skip_special) != table.decode(every_id, skip_special):
            return None
    return table


class ByteStreamDetokenizer(StopStringText):
    """IncrementalDetokenizer's contract (engine/detokenizer.py) for a byte-level BPE tokenizer.

    Args:
        table: the tokenizer's ByteLevelTable.
        context_token_ids: the tokens before the output; never emitted. A character whose first
            bytes end the context (a resumed request) is emitted whole once the output completes it.
        stop, skip_special_tokens: as for IncrementalDetokenizer.

    The deltas split differently from the window's (an invalid byte shows as U+FFFD at once; the
    window held up to 3 of them back), but their concatenation is the same text.
    """

    def __init__(
        self,
        table: ByteLevelTable,
        context_token_ids: Sequence[int],
        stop: Iterable[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        super().__init__(stop)
        self._bytes = table.skip if skip_special_tokens else table.keep
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        # Only the context's unfinished character matters: its bytes start within the last
        # _PENDING_BYTES, and the decoder keeps them (their text, and the text before, is dropped).
        start, num_bytes = len(context_token_ids), 0
        while start > 0 and num_bytes < _PENDING_BYTES:
            start -= 1
            num_bytes += len(_join(self._bytes, context_token_ids[start : start + 1]))
        self._utf8.decode(_join(self._bytes, context_token_ids[start:]))

    def add_tokens(self, new_token_ids: Sequence[int]) -> str:
        """Feed the next output tokens; returns the text now safe to emit ("" once stopped)."""
        if len(new_token_ids) == 1:
            return self.add_token(new_token_ids[0])
        if self.stopped or not new_token_ids:
            return ""
        return self._release(self._utf8.decode(_join(self._bytes, new_token_ids)), final=False)

    def add_token(self, token_id: int) -> str:
        """add_tokens([token_id]) without the list: the engine's call, once a step for every running request (the
        common case: one token a step)."""
        if self.stopped:
            return ""
        table = self._bytes
        data = table[token_id] if token_id < len(table) else _join(table, (token_id,))
        return self._release(self._utf8.decode(data), final=False)

    def flush(self) -> str:
        """What is still held back, once generation has finished without a stop string."""
        if self.stopped:
            return ""
        return self._release(self._utf8.decode(b"", final=True), final=True)
