"""API settings, read from the environment (INFERQ_*) at the edge only.

Every field is documented here and in the README; defaults are chosen for one
API replica beside one worker and can all be overridden with environment
variables, e.g. `INFERQ_REDIS_URL=redis://redis:6379/0`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _split_csv(value: object) -> object:
    """Lists come from the environment as comma-separated strings ("a,b,c")."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class ApiSettings(BaseSettings):
    """Settings of one API replica (env prefix INFERQ_)."""

    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore", frozen=True)

    # Redis and wire contract.
    redis_url: str = "redis://localhost:6379/0"
    # Connection pool of one replica: the commands of concurrent requests (streams share one pub/sub
    # connection, api/event_hub.py); a cap, not a preallocation.
    redis_max_connections: int = Field(4096, ge=8)
    prefix: str = Field("inferq", pattern=r"^[A-Za-z0-9._-]{1,64}$")

    # HTTP server.
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    # uvloop and httptools (C) rather than asyncio's loop and h11 (pure Python): per request they cut the
    # API's CPU and the time to the response headers (decision 0029).
    # The pure-Python pair stays for platforms without those wheels.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    http_parser: Literal["httptools", "h11"] = "httptools"
    # NOTE: 1 MiB holds a prompt of ~250k tokens of English; larger bodies are answered 413
    # before they are read in full.
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    # Sum of all request header names and values; uvicorn's own limit (h11: 64 KiB as we start it;
    # httptools sets none) stays above it so that our 431 answers in OpenAI's error format.
    max_header_bytes: int = Field(8 * 1024, ge=1024, le=60 * 1024)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # A connection must deliver a request's headers this long after it opens (or after the first byte of
    # its next request); past it the server answers 408 and closes (api/http_server.py: uvicorn has no such
    # timeout of its own, so a client that never finishes its headers would hold the connection forever).
    header_timeout_s: float = Field(10.0, gt=0)
    # A request's whole body must arrive this long after its headers; past it 408 and the connection is
    # closed (api/middleware.py). 30 s carries the largest body (max_body_bytes) at ~35 KB/s.
    body_timeout_s: float = Field(30.0, gt=0)
    # The same for an upload of a batch input file (POST /v1/files; its size limit is INFERQ_MAX_FILE_BYTES).
    upload_timeout_s: float = Field(600.0, gt=0)
    # Open connections of one client address to one replica; the next one is answered 429 once its
    # headers arrive, then closed (api/http_server.py). The address is the TCP peer's: behind a proxy
    # or load balancer it is the proxy's, so raise this (or 0: no cap) there.
    max_connections_per_client: int = Field(1024, ge=0)

    # Auth: empty means auth is off. Comma-separated in the environment.
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)

    # Admission control: requests admitted but not yet started by a worker.
    max_queued_requests: int = Field(256, ge=0)
    max_queued_prompt_tokens: int = Field(1_000_000, ge=0)
    # One API key may hold at most this fraction of max_queued_requests (at least one request), so that one
    # tenant's burst leaves room for the others; past it 429. Checked in the same atomic script as the cap,
    # so replicas agree. Without auth, or with a single key, every request is the same caller: only the cap applies.
    max_queued_per_key_fraction: float = Field(0.5, gt=0, le=1)
    # Seconds a 503 tells the client to wait.
    overload_retry_after_s: int = Field(1, ge=1)
    # A request that has not started after this many seconds is dropped by the worker with an error.
    queue_timeout_s: float = Field(300.0, gt=0)

    # Per-API-key rate limits over a fixed one-minute window; 0 disables.
    rate_limit_rpm: int = Field(0, ge=0)
    # Tokens count as prompt tokens + max_tokens (a reservation, as OpenAI counts them).
    rate_limit_tpm: int = Field(0, ge=0)

    # Streaming.
    resume_grace_s: float = Field(5.0, ge=0)  # a dropped client may re-attach this long before we cancel
    sse_ping_s: float = Field(15.0, gt=0)
    # Non-streaming requests wait at most this long for the whole answer (504 after, and cancelled).
    request_timeout_s: float = Field(600.0, gt=0)
    # Result streams, request metadata and idempotency keys live this long (matches the worker's TTL).
    result_ttl_s: int = Field(3600, ge=60)

    # Generation limits. None: up to the model's context.
    default_max_tokens: int | None = Field(None, ge=1)
    max_tokens_limit: int | None = Field(None, ge=1)
    # Completions default to 16 tokens, as OpenAI and vLLM do.
    default_completion_max_tokens: int = Field(16, ge=1)

    # Model: empty means "whatever the workers serve" (read from Redis).
    served_model_name: str = ""
    # How tool_choice "auto" output is read: "" picks from the model's chat template (api/tool_parsers/).
    tool_parser: Literal["", "hermes", "llama3_json"] = ""

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _lists_from_csv(cls, value: object) -> object:
        return _split_csv(value)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    @property
    def max_queued_per_key(self) -> int:
        """Requests one API key may have queued: its fraction of the cap, at least one."""
        return max(1, math.floor(self.max_queued_per_key_fraction * self.max_queued_requests))
