"""Bearer API keys: who is calling, checked on every route but /health, /ready and the chat page
(docs/decisions/0039-open-and-guarded-routes.md says why those).

Keys are compared in constant time against every configured key (no early exit,
so the time taken says nothing about which key or how much of it matched). The
caller's identity stored in Redis (request owner, rate-limit buckets, idempotency
keys) is a digest of the key, never the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from api.errors import ApiError
from api.settings import ApiSettings

ANONYMOUS = "anonymous"

# auto_error=False: a missing or malformed header is answered by us, in OpenAI's envelope.
_bearer = HTTPBearer(auto_error=False, description="An API key from INFERQ_API_KEYS (when auth is on).")


@dataclass(frozen=True)
class Caller:
    """The authenticated caller; `owner` tags every request it creates."""

    owner: str


def key_owner(api_key: str) -> str:
    return "key-" + hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:24]


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="inferq"'})


def check_key(presented: str, configured: list[str]) -> bool:
    presented_bytes = presented.encode("utf-8")
    matched = False
    for key in configured:
        # NOTE: `|` not `or`: every key is compared, whatever matched before.
        matched |= hmac.compare_digest(presented_bytes, key.encode("utf-8"))
    return matched


async def require_caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Caller:
    settings = request.app.state.settings
    if not settings.auth_enabled:
        return Caller(owner=ANONYMOUS)
    if credentials is None:
        raise _unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
    if not check_key(credentials.credentials, settings.api_keys):
        raise _unauthorized("incorrect API key provided")
    return Caller(owner=key_owner(credentials.credentials))


def caller_from_header(authorization: str | None, settings: ApiSettings) -> Caller | None:
    """The caller an Authorization header names, None when auth is on and it names none (parsed as the routes'
    HTTPBearer parses it), for checks that run before any route: the admission gate."""
    if not settings.auth_enabled:
        return Caller(owner=ANONYMOUS)
    scheme, key = get_authorization_scheme_param(authorization)
    if scheme.lower() != "bearer" or not key or not check_key(key, settings.api_keys):
        return None
    return Caller(owner=key_owner(key))


async def optional_caller(request: Request) -> Caller | None:
    """The caller, or None when auth is on and the request carries no valid key: for a route open to anyone
    that tells a caller with a key more. NOTE: not through HTTPBearer, so that the OpenAPI document does not
    list the route as needing a key."""
    return caller_from_header(request.headers.get("authorization"), request.app.state.settings)


# What a route declares to require an API key: `caller: AuthorizedCaller`.
AuthorizedCaller = Annotated[Caller, Depends(require_caller)]
# What an open route declares to know whether the caller holds a key.
OptionalCaller = Annotated[Caller | None, Depends(optional_caller)]
