"""The Redis wire contract between job submitters (the API, any other service) and workers.

Stdlib only: the API image imports this module without torch, the engine or even redis.
Every stream, group and key name lives in `Keys`; every message has a `v` version field.

Request stream `{prefix}:requests`, consumer group `{prefix}:workers`. A request message is a
flat map of strings (XADD fields) so that any language can submit:

    v="1", id=<[A-Za-z0-9._:-]{1,128}>,
    exactly one of prompt=<text> | messages=<JSON list of {role, content}> | prompt_token_ids=<JSON list of ints>,
    params=<JSON object of SamplingParams fields, optional>, priority=<int, optional, lower first>,
    deadline=<unix seconds, optional>, result_stream=<optional>, created=<unix seconds, optional>

Fields are only ever added to version 1 as optional ones that older readers ignore (a result event's
`prompt_logprobs`); a worker that does not know a sampling parameter refuses the request with an
error event naming it, so a newer parameter never passes unnoticed.

Result stream (per request) `{prefix}:result:{id}`: events written ONLY with explicit ids "0-{seq}",
seq = 1, 2, 3, ...; Redis rejects an id equal to or below the last one, which is what makes a
resumed request's output exactly-once. Live copies of the same events go to the pub/sub channel
`{prefix}:events:{id}` as JSON objects.
"""

# NOTE: the package re-exports the whole contract, so `from worker.protocol import X` is the one import.
from worker.protocol.events import (
    ResultEvent,
    decode_event,
    encode_event,
    encode_event_for_write,
    encode_token_for_write,
    event_to_json,
    is_complete,
)
from worker.protocol.names import (
    DEFAULT_CANCEL_TTL_S,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_HEARTBEAT_TTL_S,
    DEFAULT_PREFIX,
    DEFAULT_RESULT_TTL_S,
    EVENT_TYPES,
    FINISH_REASONS,
    MAX_REQUEST_ID_CHARS,
    MAX_RESULT_STREAM_CHARS,
    PROTOCOL_VERSION,
    REQUEST_ID_PATTERN,
    SAMPLING_PARAM_FIELDS,
    Keys,
    ProtocolError,
    make_consumer_name,
    seq_from_stream_id,
    stream_id,
)
from worker.protocol.records import ModelInfo, WorkerHeartbeat, encode_dead_letter, tokenizer_fields
from worker.protocol.requests import RequestMessage, decode_request, encode_request, request_id_of

__all__ = [
    "DEFAULT_CANCEL_TTL_S",
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_HEARTBEAT_TTL_S",
    "DEFAULT_PREFIX",
    "DEFAULT_RESULT_TTL_S",
    "EVENT_TYPES",
    "FINISH_REASONS",
    "Keys",
    "MAX_REQUEST_ID_CHARS",
    "MAX_RESULT_STREAM_CHARS",
    "ModelInfo",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "REQUEST_ID_PATTERN",
    "RequestMessage",
    "ResultEvent",
    "SAMPLING_PARAM_FIELDS",
    "WorkerHeartbeat",
    "decode_event",
    "decode_request",
    "encode_dead_letter",
    "encode_event",
    "encode_event_for_write",
    "encode_token_for_write",
    "encode_request",
    "event_to_json",
    "is_complete",
    "make_consumer_name",
    "request_id_of",
    "seq_from_stream_id",
    "stream_id",
    "tokenizer_fields",
]
