"""Prompt length in tokens, without torch: the `tokenizers` library plus the chat template.

The API needs the prompt's length to answer "prompt over the context" with a 400
before anything is enqueued. It never sends token ids it computed itself: the
worker tokenizes again (its count is the truth, the engine checks the limit too).

Where the tokenizer comes from: each worker writes the Redis hash `{prefix}:tokenizer`
at start, with fields
    sha256          hex digest of tokenizer_json (cheap change detection)
    tokenizer_json  the Hugging Face fast tokenizer, serialized (`tokenizer.backend_tokenizer.to_str()`)
    chat_template   the checkpoint's Jinja chat template ("" when none)
    bos_token, eos_token  special-token strings the template may use
The API loads it once per digest. Until a worker has published one, the length check
is skipped (the engine still refuses an over-long prompt with an error event).

The chat template is rendered the way transformers does it (sandboxed Jinja, trim_blocks,
lstrip_blocks, loopcontrols, `raise_exception`, `tojson`, `strftime_now`), then encoded
without adding special tokens: the template writes them itself. A special token's text inside
the messages is encoded as text, in the same steps as engine/tokenizer.py's apply_chat_template
(api/chat_text.py), so both count the same tokens.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
from jinja2 import Template, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from redis.asyncio import Redis
from tokenizers import Tokenizer

from api.background_refresh import BackgroundRefresh
from api.chat_text import MaskedMessages, compile_special_pattern, mentions, plain_text_ids
from api.errors import bad_request

log = logging.getLogger("inferq.api")

# How often a replica asks Redis whether the tokenizer changed (a worker with another model).
REFRESH_INTERVAL_S = 5.0


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile(chat_template: str) -> Template | None:
    if not chat_template:
        return None
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(chat_template)


@dataclass
class PromptTokenizer:
    """Counts prompt tokens the way the worker's engine encodes them."""

    tokenizer: Tokenizer
    template: Template | None
    bos_token: str
    eos_token: str
    digest: str
    special_pattern: re.Pattern[str] | None  # the special tokens' texts (encoded as text inside messages)
    chat_template: str = ""  # its text (which tool call format the model was taught: api/tool_parsers/)

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> PromptTokenizer:
        """Build from the published hash (raises ValueError/TemplateError on a broken one)."""
        tokenizer = Tokenizer.from_str(fields["tokenizer_json"])
        specials = (token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special)
        return cls(
            tokenizer=tokenizer,
            template=_compile(fields.get("chat_template", "")),
            bos_token=fields.get("bos_token", ""),
            eos_token=fields.get("eos_token", ""),
            digest=fields.get("sha256", ""),
            special_pattern=compile_special_pattern(specials),
            chat_template=fields.get("chat_template", ""),
        )

    def count_text(self, text: str) -> int:
        """Tokens of a completion prompt (special tokens added, as engine.encode does)."""
        return len(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The template's text; `tools` (OpenAI tool objects, or None) is always defined, as transformers'
        apply_chat_template defines it, so a template's `tools is defined` / `tools is none` reads the same."""
        if self.template is None:
            raise bad_request("this model has no chat template; use /v1/completions", param="messages")
        try:
            return self.template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=tools or None,
            )
        except (TemplateError, TypeError, ValueError, KeyError) as exc:  # a template's own arithmetic fails too
            # The model's template refused these messages (e.g. roles out of order).
            raise bad_request(f"messages: the chat template rejected them: {exc}", param="messages") from None

    def chat_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt's token ids, as engine/tokenizer.py's apply_chat_template gives them."""
        if self.special_pattern is None or not mentions(messages, self.special_pattern):
            return self.tokenizer.encode(self.render_chat(messages, tools), add_special_tokens=False).ids
        masked = MaskedMessages(messages, self.special_pattern)
        return masked.encode(
            self.render_chat(masked.messages, tools),
            lambda s: self.tokenizer.encode(s, add_special_tokens=False).ids,
            lambda s: plain_text_ids(self.tokenizer, s),
        )

    def count_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        return len(self.chat_ids(messages, tools))


class TokenizerCache:
    """The published tokenizer, loaded once per digest and re-checked every few seconds.

    NOTE: the Redis client must use decode_responses=True (the app's does).
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._current: PromptTokenizer | None = None
        self._checked_at = float("-inf")
        self._lock = anyio.Lock()
        self._refresher = BackgroundRefresh(self._refresh, "the published tokenizer")

    async def get(self, redis: Redis) -> PromptTokenizer | None:
        """The tokenizer, re-checked at most every REFRESH_INTERVAL_S; a loaded one answers at once while a
        task re-checks it (api/background_refresh.py says why), a missing one is waited for."""
        if time.monotonic() - self._checked_at < REFRESH_INTERVAL_S:
            return self._current
        if self._current is None:
            return await self._refresh(redis)
        self._refresher.start(redis)
        return self._current

    async def _refresh(self, redis: Redis) -> PromptTokenizer | None:
        async with self._lock:
            if time.monotonic() - self._checked_at < REFRESH_INTERVAL_S:
                return self._current
            digest = await redis.hget(self.key, "sha256")
            if digest is None:
                self._current = None
            elif self._current is None or self._current.digest != digest:
                fields = await redis.hgetall(self.key)
                try:
                    # Parsing a few MB of JSON takes a while: keep it off the event loop.
                    self._current = await anyio.to_thread.run_sync(PromptTokenizer.from_fields, fields)
                    log.info("loaded the workers' tokenizer (sha256 %s)", digest[:12])
                except Exception as exc:  # a broken publication must not take the API down
                    log.error("cannot load the tokenizer published at %s: %s", self.key, exc)
                    self._current = None
            self._checked_at = time.monotonic()
            return self._current
