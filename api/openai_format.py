"""Result events -> OpenAI JSON: streamed chunks and whole responses, chat and completion.

Streaming follows OpenAI's shapes exactly (what the official SDK parses):
    chat:        {"object": "chat.completion.chunk", "choices": [{"index", "delta", "logprobs", "finish_reason"}]}
    completion:  {"object": "text_completion", "choices": [{"index", "text", "logprobs", "finish_reason"}]}
The assistant role rides on the first chunk of each choice (so every chunk maps to one
result event and carries its seq as the SSE id). With include_usage every chunk has
"usage": null and a last chunk with no choices carries the totals.

Completions' echo (vLLM's): a choice's first chunk (or its whole text) starts with the prompt, and its logprobs with
the prompt's tokens (the first one's logprob and top_logprobs null); text offsets count from the prompt's start.
With max_tokens 0 the engine's one token is left out: the prompt alone, finish_reason "length", no completion
tokens in the usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from api.logprob_format import CompletionLogprobs, Entry, TextOffsets, TokenTexts, chat_content, parse_entries
from api.request_meta import CHAT, RequestMeta
from api.tool_output import ChoiceToolCalls, reads_tool_calls, whole_message
from worker.protocol import ResultEvent

# The finish reasons OpenAI's clients know. The wire's other two never reach a client as one: "abort" (the
# request was cancelled) becomes a `request_cancelled` error, "error" a generation error
# (docs/decisions/0047-cancelled-requests.md).
OPENAI_FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
CANCELLED = "abort"


def cancelled_message(request_id: str) -> str:
    return (
        f"request {request_id} was cancelled (POST /v1/requests/{request_id}/cancel, or its client left and did "
        "not come back within the resume grace period)"
    )


def usage_of(done_events: list[ResultEvent], meta: RequestMeta, fallback_completion_tokens: int) -> dict[str, int]:
    """Totals over the choices: the prompt counted once, completion tokens summed (none shown: none counted)."""
    usages = [e.usage for e in done_events if isinstance(e.usage, dict)]
    if usages and len(usages) == len(done_events):
        prompt = int(usages[0].get("prompt_tokens", meta.prompt_tokens))
        completion = sum(int(u.get("completion_tokens", 0)) for u in usages)
    else:
        prompt, completion = meta.prompt_tokens, fallback_completion_tokens
    if meta.output_hidden:
        completion = 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def echo_text(meta: RequestMeta, texts: TokenTexts) -> str:
    """The prompt an echo shows: its text as sent, or its token ids decoded (their bytes, as UTF-8)."""
    if meta.echo is None:
        return ""
    prompt = json.loads(meta.echo)
    if isinstance(prompt, str):
        return prompt
    return b"".join(texts.get(int(token))[1] for token in prompt).decode("utf-8", "replace")


def _shown_finish(meta: RequestMeta, finish_reason: str | None) -> str | None:
    """max_tokens 0 ends by length, whatever ended the one token the engine generated."""
    return "length" if meta.output_hidden and finish_reason is not None else finish_reason


class ChunkFormatter:
    """Turns one request's ordered events into streamed chunks."""

    def __init__(self, meta: RequestMeta, texts: TokenTexts) -> None:
        self.meta = meta
        self.texts = texts
        # NOTE: a resumed stream first replays the events before the resume point through
        # `chunk` (and drops the chunks), so the role, text offsets and usage stay right.
        self._role_sent: set[int] = set()
        self._offsets: dict[int, TextOffsets] = {}  # per choice, from its first event on
        self._echo: str | None = None
        self._tool_calls: dict[int, ChoiceToolCalls] = {}  # per choice, when the output is read for tool calls
        self.done: list[ResultEvent] = []
        self.completion_tokens = 0

    def _base(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.meta.kind == CHAT else "text_completion"
        base = {"id": self.meta.request_id, "object": obj, "created": self.meta.created, "model": self.meta.model}
        return base

    def chunk(self, event: ResultEvent) -> dict[str, Any]:
        """The chunk of a token or done event (an error event is formatted by `error_chunk`)."""
        index = event.index
        finish = event.finish_reason if event.type == "done" else None
        text = (event.text or "") if event.type == "token" else ""
        if event.type == "token":
            self.completion_tokens += len(event.token_ids or [])
        else:
            self.done.append(event)
        if self.meta.kind == CHAT:
            delta: dict[str, Any] = {}
            if index not in self._role_sent:
                delta["role"] = "assistant"
                self._role_sent.add(index)
            if reads_tool_calls(self.meta):
                finish = self._tool_delta(delta, event, text, finish)
            elif event.type == "token" or "role" in delta:
                delta["content"] = text
            entries = parse_entries(event.logprobs) if self.meta.logprobs is not None else []
            logprobs = {"content": chat_content(entries, self.texts)} if entries else None
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            want = self.meta.logprobs is not None
            entries = parse_entries(event.logprobs) if want else []
            if self.meta.output_hidden:
                text, entries = "", []
            logprobs = CompletionLogprobs.empty()
            if index not in self._offsets:  # the choice's first event: the echo goes first
                prompt = self._echo_text()
                if self.meta.echo is not None and want:
                    logprobs.add(parse_entries(event.prompt_logprobs), self.texts, TextOffsets())
                text = prompt + text
                self._offsets[index] = TextOffsets(len(prompt))
            logprobs.add(entries, self.texts, self._offsets[index])
            body = logprobs.body() if logprobs.tokens else None
            choice = {"index": index, "text": text, "logprobs": body, "finish_reason": _shown_finish(self.meta, finish)}
        out = self._base() | {"choices": [choice]}
        if self.meta.include_usage:
            out["usage"] = None
        return out

    def _tool_delta(self, delta: dict[str, Any], event: ResultEvent, text: str, finish: str | None) -> str | None:
        """Fill a chat delta from the choice's tool-call reader; the choice's finish reason."""
        reader = self._tool_calls.get(event.index)
        if reader is None:
            reader = self._tool_calls[event.index] = ChoiceToolCalls(self.meta, event.index)
        content, calls = reader.feed(text) if event.type == "token" else reader.close()
        if content or ("role" in delta and not calls):
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return reader.finish_reason(finish) if event.type == "done" else finish

    def _echo_text(self) -> str:
        if self._echo is None:
            self._echo = echo_text(self.meta, self.texts)
        return self._echo

    def usage_chunk(self) -> dict[str, Any]:
        return self._base() | {"choices": [], "usage": usage_of(self.done, self.meta, self.completion_tokens)}


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    prompt_entries: list[Entry] | None = None  # set by the choice's first event
    finish_reason: str | None = None


class WholeResponse:
    """Accumulates every event of a non-streamed request into one OpenAI response."""

    def __init__(self, meta: RequestMeta, texts: TokenTexts) -> None:
        self.meta = meta
        self.texts = texts
        self.choices = [_Choice() for _ in range(meta.n)]
        self.done: list[ResultEvent] = []
        self.completion_tokens = 0

    def add(self, event: ResultEvent) -> None:
        if not 0 <= event.index < self.meta.n:
            return
        choice = self.choices[event.index]
        want = self.meta.logprobs is not None
        if choice.prompt_entries is None:
            choice.prompt_entries = parse_entries(event.prompt_logprobs) if want and self.meta.echo else []
        if event.type == "token":
            self.completion_tokens += len(event.token_ids or [])
            if not self.meta.output_hidden:
                choice.text.append(event.text or "")
                if want:
                    choice.entries.extend(parse_entries(event.logprobs))
        elif event.type == "done":
            choice.finish_reason = event.finish_reason
            self.done.append(event)

    def body(self) -> dict[str, Any]:
        want_logprobs = self.meta.logprobs is not None
        prompt = echo_text(self.meta, self.texts)
        choices = []
        for index, c in enumerate(self.choices):
            text = "".join(c.text)
            if self.meta.kind == CHAT:
                logprobs = {"content": chat_content(c.entries, self.texts)} if want_logprobs and c.entries else None
                message: dict[str, Any] = {"role": "assistant", "content": text}
                finish_reason = c.finish_reason
                if reads_tool_calls(self.meta):
                    message, reader = whole_message(self.meta, index, text)
                    finish_reason = reader.finish_reason(finish_reason)
                choices.append(
                    {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
                )
            else:
                logprobs = CompletionLogprobs.empty().add(c.prompt_entries or [], self.texts, TextOffsets())
                logprobs.add(c.entries, self.texts, TextOffsets(len(prompt)))
                body = logprobs.body() if want_logprobs and logprobs.tokens else None
                finish = _shown_finish(self.meta, c.finish_reason)
                choices.append({"index": index, "text": prompt + text, "logprobs": body, "finish_reason": finish})
        return {
            "id": self.meta.request_id,
            "object": "chat.completion" if self.meta.kind == CHAT else "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": choices,
            "usage": usage_of(self.done, self.meta, self.completion_tokens),
        }
