"""Result events -> OpenAI JSON: streamed chunks and whole responses, chat and completion.

Streaming follows OpenAI's shapes exactly (what the official SDK parses):
    chat:        {"object": "chat.completion.chunk", "choices": [{"index", "delta", "logprobs", "finish_reason"}]}
    completion:  {"object": "text_completion", "choices": [{"index", "text", "logprobs", "finish_reason"}]}
The assistant role rides on the first chunk of each choice (so every chunk maps to one
result event and carries its seq as the SSE id). With include_usage every chunk has
"usage": null and a last chunk with no choices carries the totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.request_meta import CHAT, RequestMeta
from worker.protocol import ResultEvent

# Token ids -> token strings for logprobs; None when no tokenizer is known.
TokenNamer = Any


def _token_text(namer: TokenNamer, token_id: int, given: str | None = None) -> str:
    if given is not None:
        return given
    if namer is not None:
        text = namer.id_to_token(token_id)
        if text is not None:
            return text
    return f"token_id:{token_id}"


def _entries(raw: Any) -> list[dict[str, Any]]:
    """The worker's per-token logprobs: a list of {token_id, logprob, top: {id: lp}} (top may be pairs)."""
    if not isinstance(raw, list):
        return []
    entries = []
    for item in raw:
        if not isinstance(item, dict) or "logprob" not in item:
            continue
        top = item.get("top") or {}
        if isinstance(top, list):
            top = {int(t): lp for t, lp in top}
        entries.append(
            {
                "token_id": int(item.get("token_id", -1)),
                "token": item.get("token"),
                "logprob": float(item["logprob"]),
                "top": {int(k): float(v) for k, v in top.items()},
            }
        )
    return entries


def chat_logprobs(raw: Any, namer: TokenNamer) -> dict[str, Any] | None:
    entries = _entries(raw)
    if not entries:
        return None
    content = []
    for e in entries:
        token = _token_text(namer, e["token_id"], e["token"])
        top = [
            {"token": (t := _token_text(namer, tid)), "logprob": lp, "bytes": list(t.encode("utf-8"))}
            for tid, lp in sorted(e["top"].items(), key=lambda kv: -kv[1])
        ]
        content.append(
            {"token": token, "logprob": e["logprob"], "bytes": list(token.encode("utf-8")), "top_logprobs": top}
        )
    return {"content": content}


def completion_logprobs(raw: Any, namer: TokenNamer, text_offset: int) -> dict[str, Any] | None:
    entries = _entries(raw)
    if not entries:
        return None
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for e in entries:
        token = _token_text(namer, e["token_id"], e["token"])
        tokens.append(token)
        token_logprobs.append(e["logprob"])
        top_logprobs.append({_token_text(namer, tid): lp for tid, lp in e["top"].items()})
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def usage_of(done_events: list[ResultEvent], meta: RequestMeta, fallback_completion_tokens: int) -> dict[str, int]:
    """Totals over the choices: the prompt counted once, completion tokens summed."""
    usages = [e.usage for e in done_events if isinstance(e.usage, dict)]
    if usages and len(usages) == len(done_events):
        prompt = int(usages[0].get("prompt_tokens", meta.prompt_tokens))
        completion = sum(int(u.get("completion_tokens", 0)) for u in usages)
    else:
        prompt, completion = meta.prompt_tokens, fallback_completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ChunkFormatter:
    """Turns one request's ordered events into streamed chunks."""

    def __init__(self, meta: RequestMeta, namer: TokenNamer) -> None:
        self.meta = meta
        self.namer = namer
        # NOTE: a resumed stream first replays the events before the resume point through
        # `chunk` (and drops the chunks), so the role, text offsets and usage stay right.
        self._role_sent: set[int] = set()
        self._text_offset: dict[int, int] = {}
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
            if event.type == "token" or "role" in delta:
                delta["content"] = text
            logprobs = chat_logprobs(event.logprobs, self.namer) if self.meta.logprobs is not None else None
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            offset = self._text_offset.get(index, 0)
            logprobs = (
                completion_logprobs(event.logprobs, self.namer, offset) if self.meta.logprobs is not None else None
            )
            self._text_offset[index] = offset + len(text)
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        out = self._base() | {"choices": [choice]}
        if self.meta.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return self._base() | {"choices": [], "usage": usage_of(self.done, self.meta, self.completion_tokens)}


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    raw_logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None


class WholeResponse:
    """Accumulates every event of a non-streamed request into one OpenAI response."""

    def __init__(self, meta: RequestMeta, namer: TokenNamer) -> None:
        self.meta = meta
        self.namer = namer
        self.choices = [_Choice() for _ in range(meta.n)]
        self.done: list[ResultEvent] = []
        self.completion_tokens = 0

    def add(self, event: ResultEvent) -> None:
        if not 0 <= event.index < self.meta.n:
            return
        choice = self.choices[event.index]
        if event.type == "token":
            choice.text.append(event.text or "")
            self.completion_tokens += len(event.token_ids or [])
            if isinstance(event.logprobs, list):
                choice.raw_logprobs.extend(event.logprobs)
        elif event.type == "done":
            choice.finish_reason = event.finish_reason
            self.done.append(event)

    def body(self) -> dict[str, Any]:
        want_logprobs = self.meta.logprobs is not None
        choices = []
        for index, c in enumerate(self.choices):
            text = "".join(c.text)
            if self.meta.kind == CHAT:
                logprobs = chat_logprobs(c.raw_logprobs, self.namer) if want_logprobs else None
                message = {"role": "assistant", "content": text}
                choices.append(
                    {"index": index, "message": message, "logprobs": logprobs, "finish_reason": c.finish_reason}
                )
            else:
                logprobs = completion_logprobs(c.raw_logprobs, self.namer, 0) if want_logprobs else None
                choices.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason})
        return {
            "id": self.meta.request_id,
            "object": "chat.completion" if self.meta.kind == CHAT else "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": choices,
            "usage": usage_of(self.done, self.meta, self.completion_tokens),
        }
