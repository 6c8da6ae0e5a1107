"""A special token's text inside chat messages, encoded as the text it is.

A user who types `<|im_start|>system` must not open a system turn: only the chat template's own
markup may become special tokens. The messages' special-token texts are swapped for unique marks,
the template renders, the result is cut at the marks, and each mark's original text is encoded
with no added token matched (what `split_special_tokens=True` gives), the template's pieces as usual.

NOTE: engine/chat_text.py is this file's twin in the worker's engine (the API may not import the
engine); the API counts prompt tokens with these steps, `tokenizers` and its own Jinja, and must
count what the engine encodes: tests/engine/test_chat_special_text.py holds the two equal on every
packaged template.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# Private-use characters (no tokenizer or template gives them a meaning) around a per-call random
# number: a mark no user can type by chance or by guessing.
_MARK_START, _MARK_END = "\U000f0000", "\U000f0001"


def compile_special_pattern(texts: Iterable[str]) -> re.Pattern[str] | None:
    """A regex matching any of `texts`, the longest where several start at one place (as a tokenizer matches its
    added tokens), or None when there are none.

    NOTE: built as a trie, one character at a time: a plain alternation tries every text at every `<`, which for
    a vocabulary with thousands of special tokens (`<unused0>` ... `<unused6000>`) is slow on long prompts.
    """
    trie: dict[str, dict] = {}
    for text in {t for t in texts if t}:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}  # a text ends here
    return re.compile(_trie_regex(trie)) if trie else None


def _trie_regex(node: dict[str, dict]) -> str:
    branches = [re.escape(char) + _trie_regex(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    return f"(?:{body})?" if "" in node else body  # greedy: a longer text wins over one that ends here


def mentions(messages: Any, pattern: re.Pattern[str]) -> bool:
    """Whether any string inside the messages holds a special token's text."""
    return any(pattern.search(s) for s in _strings(messages))


def _strings(value: Any) -> Iterator[str]:
    # Dict keys are the template's names (role, content), not message text.
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def plain_text_ids(backend: Any, text: str) -> list[int]:
    """Ids of `text` from a `tokenizers.Tokenizer` with no added token matched: its normalizer,
    pre-tokenizer and model, as `encode` runs them between added tokens. Stateless, so safe on any
    thread (the Tokenizer's `encode_special_tokens` flag is shared state)."""
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
    return [token.id for split in splits for token in backend.model.tokenize(split)]


class MaskedMessages:
    """Messages whose special-token texts are swapped for unique marks, and the encoding of their rendering.

    A template may drop or repeat a message's text: every mark found is put back, wherever it lands.
    """

    def __init__(self, messages: Any, pattern: re.Pattern[str]) -> None:
        self.originals: list[str] = []
        nonce = secrets.randbelow(10**18)
        self._marks = re.compile(f"{_MARK_START}{nonce}\\.(\\d+){_MARK_END}")

        def mark(match: re.Match[str]) -> str:
            self.originals.append(match.group(0))
            return f"{_MARK_START}{nonce}.{len(self.originals) - 1}{_MARK_END}"

        self.messages = _replace_strings(messages, lambda s: pattern.sub(mark, s))

    def encode(
        self, text: str, encode: Callable[[str], list[int]], encode_as_text: Callable[[str], list[int]]
    ) -> list[int]:
        """Token ids of `text`, the template's rendering of self.messages.

        Args:
            encode: the tokenizer's encoding (special tokens matched), without added BOS/EOS.
            encode_as_text: the same with no added token matched.
        """
        pieces = self._marks.split(text)  # [template, mark index, template, ..., template]
        ids = list(encode(pieces[0]))
        newline_ids, newline_text_ids = list(encode("\n")), list(encode_as_text("\n"))
        for i, piece in enumerate(pieces[1:], start=1):
            if i % 2:
                ids += _encode_after_text(encode_as_text, self.originals[int(piece)], newline_text_ids)
            elif piece:
                ids += _encode_after_text(encode, piece, newline_ids)
        return [int(i) for i in ids]


def _replace_strings(value: Any, sub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return sub(value)
    if isinstance(value, dict):
        return {key: _replace_strings(item, sub) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace_strings(item, sub) for item in value]
    return value


def _encode_after_text(encode: Callable[[str], list[int]], text: str, newline_ids: list[int]) -> list[int]:
    """`text`'s ids where it continues a line: encoded after a newline that is then dropped.

    NOTE: a SentencePiece-style tokenizer puts a space before the first word of a whole string, which
    text in mid-prompt must not get. Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2) splits the newline
    off first and gives the same ids either way. transformers' own sanitizing of chat input
    (`sanitize_control_tokens`) takes the same step.
    """
    ids = list(encode("\n" + text))
    if newline_ids and ids[: len(newline_ids)] == newline_ids:
        return ids[len(newline_ids) :]
    return list(encode(text))
