"""Logprobs as OpenAI shows them: each token as the text that decoding it alone gives, with its raw bytes.

A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, SmolLM2) spells its tokens in a printable alphabet:
'Ġsea' stands for b" sea", 'Ã©' for b"\\xc3\\xa9". OpenAI and vLLM show " sea" and "é". A token that holds only
part of a multi-byte character decodes alone to U+FFFD; its `bytes` are still the token's own bytes (as
OpenAI's are), so a client joins a character from the bytes of its tokens.

    chat:        logprobs.content = [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]
    completions: logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}

`text_offset` is where each token starts in the choice's text, in characters: the UTF-8 decoding of every byte
before the token, a character counted from the token that starts it. That is the text's own offset wherever the
text is the decoding of its tokens' bytes (byte-level BPE; a tokenizer that strips or rewrites spaces when it
decodes may differ by those).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from api.tokens import PromptTokenizer

# JSON has no -inf: a token the model rules out shows this logprob (vLLM's value).
LOWEST_LOGPROB = -9999.0
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable spelling of each byte, inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    spelled = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    return {char: b for b, char in spelled.items()}


_BYTE_OF = _byte_level_alphabet()


def _decoder_spec(tokenizer: Tokenizer) -> list[dict[str, Any]]:
    """The tokenizer's decoder steps (a Sequence unrolled), from its serialized form."""
    decoder = tokenizer.decoder
    if decoder is None:
        return []
    spec = json.loads(decoder.__getstate__())
    return spec.get("decoders", []) if spec.get("type") == "Sequence" else [spec]


class TokenTexts:
    """Token id -> (text, raw bytes), cached; text is the tokenizer's decoding of the token alone.

    Raw bytes: byte-level BPE maps each character of the token back to its byte; a SentencePiece-style
    vocabulary with byte fallback spells a byte as '<0xE9>' and a space as '▁'; any other tokenizer's tokens
    are taken as their decoded text. Without a tokenizer a token shows as "token_id:<id>" (vLLM's spelling).
    """

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}
        steps = _decoder_spec(tokenizer) if tokenizer is not None else []
        kinds = {step.get("type") for step in steps}
        self._byte_level = "ByteLevel" in kinds
        self._byte_fallback = "ByteFallback" in kinds
        self._replacements = [
            (step["pattern"]["String"], step.get("content", ""))
            for step in steps
            if step.get("type") == "Replace" and isinstance(step.get("pattern"), dict) and "String" in step["pattern"]
        ]

    def get(self, token_id: int) -> tuple[str, bytes]:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._look_up(token_id)
        return found

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]

    def _look_up(self, token_id: int) -> tuple[str, bytes]:
        if self._tokenizer is None:
            text = f"token_id:{token_id}"
            return text, text.encode()
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:  # past the vocabulary (an embedding padded past it): decodes to nothing
            return text, text.encode()
        return text, self._raw_bytes(piece, text)

    def _raw_bytes(self, piece: str, text: str) -> bytes:
        if self._byte_level:
            try:
                return bytes(_BYTE_OF[char] for char in piece)
            except KeyError:  # an added token spelled outside the byte alphabet: its text is its bytes
                return text.encode()
        if self._byte_fallback:
            if match := _BYTE_PIECE.fullmatch(piece):
                return bytes([int(match[1], 16)])
            for old, new in self._replacements:
                piece = piece.replace(old, new)
            return piece.encode()
        return text.encode()


_TEXTS_BY_DIGEST: dict[str, TokenTexts] = {}


def token_texts(published: PromptTokenizer | None) -> TokenTexts:
    """The TokenTexts of the workers' published tokenizer, kept per digest (the newest two) so that its cache
    outlives one request."""
    if published is None:
        return TokenTexts(None)
    found = _TEXTS_BY_DIGEST.get(published.digest)
    if found is None:
        found = TokenTexts(published.tokenizer)
        while len(_TEXTS_BY_DIGEST) >= 2:
            _TEXTS_BY_DIGEST.pop(next(iter(_TEXTS_BY_DIGEST)))
        _TEXTS_BY_DIGEST[published.digest] = found
    return found


@dataclass(slots=True)
class Entry:
    """One token's logprobs from the wire: logprob is None for a prompt's first token (nothing predicts it)."""

    token_id: int
    logprob: float | None
    top: dict[int, float]


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOWEST_LOGPROB


def parse_entries(raw: Any) -> list[Entry]:
    """The worker's per-token logprobs, [{token_id, logprob, top: {id: logprob}}] (top may be [id, lp] pairs)."""
    if not isinstance(raw, list):
        return []
    entries = []
    for item in raw:
        if not isinstance(item, dict) or "logprob" not in item:
            continue
        top = item.get("top") or {}
        if isinstance(top, list):
            top = {int(t): lp for t, lp in top}
        logprob = item["logprob"]
        entries.append(
            Entry(
                int(item.get("token_id", -1)),
                None if logprob is None else _finite(float(logprob)),
                {int(k): _finite(float(v)) for k, v in top.items()},
            )
        )
    return entries


def _ranked(top: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(top.items(), key=lambda kv: -kv[1])


def chat_content(entries: list[Entry], texts: TokenTexts) -> list[dict[str, Any]]:
    """logprobs.content of a chat choice."""
    content = []
    for e in entries:
        text, raw = texts.get(e.token_id)
        top = []
        for token_id, logprob in _ranked(e.top):
            alt_text, alt_raw = texts.get(token_id)
            top.append({"token": alt_text, "logprob": logprob, "bytes": list(alt_raw)})
        content.append({"token": text, "logprob": e.logprob, "bytes": list(raw), "top_logprobs": top})
    return content


def _top_by_text(top: dict[int, float], texts: TokenTexts) -> dict[str, float]:
    """Completions' top_logprobs, keyed by text: where two tokens decode alike, the likelier one's logprob."""
    by_text: dict[str, float] = {}
    for token_id, logprob in _ranked(top):
        by_text.setdefault(texts.text(token_id), logprob)
    return by_text


class TextOffsets:
    """Where each next token starts in a text, in characters (the UTF-8 decoding of the bytes before it)."""

    def __init__(self, start: int = 0) -> None:
        self.offset = start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def take(self, raw: bytes) -> int:
        """The offset of a token of these bytes; the next token's follows it."""
        at = self.offset
        self.offset += len(self._decoder.decode(raw))
        return at


@dataclass
class CompletionLogprobs:
    """A completion choice's logprobs, built up token by token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]

    @classmethod
    def empty(cls) -> CompletionLogprobs:
        return cls([], [], [], [])

    def add(self, entries: list[Entry], texts: TokenTexts, offsets: TextOffsets) -> CompletionLogprobs:
        for e in entries:
            text, raw = texts.get(e.token_id)
            self.tokens.append(text)
            self.token_logprobs.append(e.logprob)
            # NOTE: a prompt's first token has no alternatives (null, as in OpenAI's and vLLM's echo)
            self.top_logprobs.append(None if e.logprob is None else _top_by_text(e.top, texts))
            self.text_offset.append(offsets.take(raw))
        return self

    def body(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }
