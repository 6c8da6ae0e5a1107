"""What any replica needs to know about a request it did not receive: who owns it and
how to format its stream. Stored as a Redis hash beside the result stream, same TTL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from redis.asyncio import Redis

from api.keys import ApiKeys

CHAT = "chat"
COMPLETION = "completion"


@dataclass(frozen=True)
class RequestMeta:
    """One request as the API accepted it.

    Args:
        request_id: the id clients see (body `id`, header X-Request-Id) and the wire id.
        owner: the caller that created it (resume and cancel check it).
        kind: CHAT or COMPLETION (chunk format).
        model: served model name echoed in every chunk.
        created: unix seconds (OpenAI's `created`).
        n: number of choices; the stream is complete when all are done.
        include_usage: stream a usage chunk before [DONE].
        logprobs: top logprobs asked for (None: no logprobs).
        prompt_tokens: the API's count (a fallback when a worker sends no usage).
        result_stream: the wire result stream name.
        echo: the prompt as JSON (its text, or its token ids) when a completion echoes it; None otherwise.
        output_hidden: echo with max_tokens 0: the one token the engine generates is not shown (the prompt alone).
        tool_mode: how the output is read for tool calls: "" (no tools), "none", "auto", "required", "named"
            (api/tool_request.py).
        tool_parser: the format "auto" reads ("hermes", "llama3_json"; api/tool_parsers/).
        tool_name: the function a named tool_choice forces.
        constraint_field: the request field whose structured output constraint the worker enforces ("" for
            none): a constraint the worker cannot compile is a 400 naming it, streamed or not (the stream's
            headers wait for the first event).
    """

    request_id: str
    owner: str
    kind: str
    model: str
    created: int
    n: int
    include_usage: bool
    logprobs: int | None
    prompt_tokens: int
    result_stream: str
    echo: str | None = None
    output_hidden: bool = False
    tool_mode: str = ""
    tool_parser: str = ""
    tool_name: str = ""
    constraint_field: str = ""

    def to_fields(self) -> dict[str, str]:
        fields = {k: str(v) for k, v in asdict(self).items() if v is not None}
        fields["include_usage"] = "1" if self.include_usage else "0"
        fields["output_hidden"] = "1" if self.output_hidden else "0"
        return fields

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> RequestMeta:
        return cls(
            request_id=fields["request_id"],
            owner=fields["owner"],
            kind=fields["kind"],
            model=fields["model"],
            created=int(fields["created"]),
            n=int(fields["n"]),
            include_usage=fields.get("include_usage") == "1",
            logprobs=int(fields["logprobs"]) if "logprobs" in fields else None,
            prompt_tokens=int(fields.get("prompt_tokens", "0")),
            result_stream=fields["result_stream"],
            echo=fields.get("echo"),
            output_hidden=fields.get("output_hidden") == "1",
            tool_mode=fields.get("tool_mode", ""),
            tool_parser=fields.get("tool_parser", ""),
            tool_name=fields.get("tool_name", ""),
            constraint_field=fields.get("constraint_field", ""),
        )


async def save_meta(redis: Redis, keys: ApiKeys, meta: RequestMeta, ttl_s: int) -> None:
    key = keys.meta(meta.request_id)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=meta.to_fields())
        pipe.expire(key, ttl_s)
        await pipe.execute()


async def load_meta(redis: Redis, keys: ApiKeys, request_id: str) -> RequestMeta | None:
    fields = await redis.hgetall(keys.meta(request_id))
    if not fields:
        return None
    try:
        return RequestMeta.from_fields(fields)
    except (KeyError, ValueError):
        return None
