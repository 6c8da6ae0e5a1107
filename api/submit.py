"""Accepting a completion request: validate against the model, admit, and enqueue it.

Order matters and every step before the enqueue can refuse without side effects (before any of
them, a full queue's 503 is answered from the headers: api/admission_gate.py):
    model known (404) -> token ids in the vocabulary -> prompt length and max_tokens (400)
    -> Idempotency-Key seen before? attach to that request -> rate limit (429)
    -> without an Idempotency-Key: SUBSCRIBE to its events (sent, its confirmation awaited by the relay)
       -> one script: queue cap (503) and the key's share of it (429), or save request meta + XADD to the
          request stream (api/admission.py)
    -> with one: queue cap (503) and share (429) -> bind the Idempotency-Key -> save request meta
       -> SUBSCRIBE to its events -> XADD to the request stream.
NOTE: the SUBSCRIBE goes out before the script, so Redis listens for the request's events long
before a worker can have published one (it must read the message and run a step first). The two go
on different connections and Redis serves ready connections in its own order, so the script may run
first; the result stream, read once the SUBSCRIBE is confirmed, fills any gap either way. A request the script
refuses leaves only that subscription, which is closed before the 503.
Why one script: a new request's Redis work was four sequential round trips (admit, meta,
SUBSCRIBE, XADD) before its response headers; now it is one waited on (the script; the SUBSCRIBE's
confirmation arrives meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio

from api import idempotency
from api.admission import Overloaded
from api.auth import Caller
from api.errors import SERVER_ERROR, ApiError
from api.events import EventSource
from api.limits import check_token_ids, token_budget
from api.metrics import RequestObserver
from api.output_plan import NO_PLAN, OutputPlan, asks_for_output_checks, plan_output
from api.request_build import build_request, kind_of, prompt_token_count
from api.request_meta import CHAT, RequestMeta, load_meta, save_meta
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.state import AppState
from api.tokens import PromptTokenizer
from worker.protocol import RequestMessage, encode_request

log = logging.getLogger("inferq.api")

# Prompts longer than this are tokenized in a worker thread, not on the event loop.
_INLINE_TOKENIZE_CHARS = 20_000
# A new request with no event this long after its queue deadline fails on the API side too.
START_SLACK_S = 10.0


@dataclass
class Accepted:
    """A request this call may relay: new (just enqueued) or an earlier one (same Idempotency-Key)."""

    meta: RequestMeta
    source: EventSource  # opened: subscribed to the request's events
    is_new: bool
    observer: RequestObserver | None = None  # timings, for the request this replica admitted


def new_request_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}"


async def count_prompt_tokens(
    tokenizer: PromptTokenizer | None,
    body: ChatCompletionRequest | CompletionRequest,
    tools: list[dict[str, Any]] | None = None,
) -> int | None:
    """request_build.prompt_token_count, on a worker thread where the text is long enough to hold up the event
    loop."""
    if tokenizer is not None and _prompt_chars(body) > _INLINE_TOKENIZE_CHARS:
        return await anyio.to_thread.run_sync(prompt_token_count, tokenizer, body, tools)
    return prompt_token_count(tokenizer, body, tools)


def _prompt_chars(body: ChatCompletionRequest | CompletionRequest) -> int:
    if isinstance(body, CompletionRequest):
        prompt = body.single_prompt()
        return 0 if isinstance(prompt, list) else len(prompt)
    return sum(len(m["content"] or "") for m in body.wire_messages())


async def open_source(
    state: AppState, meta: RequestMeta, start_timeout_s: float | None = None, *, confirmed: bool = True
) -> EventSource:
    """The request's events, subscribed (on the process's shared pub/sub connection) and ready to read;
    confirmed=False: the SUBSCRIBE is sent, and the source waits for its confirmation when first read."""
    source = EventSource(
        state.redis,
        state.hub,
        state.keys.wire,
        meta.request_id,
        meta.result_stream,
        meta.n,
        start_timeout_s=start_timeout_s,
    )
    await source.open(confirmed=confirmed)
    return source


async def _attach_existing(state: AppState, request_id: str) -> Accepted:
    # The winner of a concurrent Idempotency-Key race saves its meta right after binding the key.
    for _ in range(20):
        meta = await load_meta(state.redis, state.keys, request_id)
        if meta is not None:
            return Accepted(meta, await open_source(state, meta), is_new=False)
        await asyncio.sleep(0.05)
    raise ApiError(
        409,
        "a request with this Idempotency-Key is being created; retry",
        code="idempotency_conflict",
        param="Idempotency-Key",
        headers={"Retry-After": "1"},
    )


async def _undo(
    state: AppState, request_id: str, claim: idempotency.IdempotencyClaim | None, source: EventSource | None
) -> None:
    """Take back what an enqueue that failed half-way did (best effort: Redis may be the failure)."""
    try:
        await state.admission.release(request_id)
        if claim is not None:
            await idempotency.forget(state.redis, claim, request_id)
    except Exception:
        log.warning("could not undo the admission of %s", request_id, exc_info=True)
    if source is not None:
        await source.close()


async def _give_up(
    state: AppState,
    request_id: str,
    claim: idempotency.IdempotencyClaim | None,
    source: EventSource | None,
    exc: BaseException,
) -> NoReturn:
    """Undo a failed enqueue and raise what the client should see (an unexpected failure: 503)."""
    with anyio.CancelScope(shield=True):
        await _undo(state, request_id, claim, source)
    if isinstance(exc, ApiError) or not isinstance(exc, Exception):
        raise exc
    log.error("could not enqueue %s", request_id, exc_info=exc)
    raise ApiError(
        503,
        f"could not enqueue the request: {exc}",
        type=SERVER_ERROR,
        code="enqueue_failed",
        headers={"Retry-After": "1"},
    ) from exc


async def submit(
    state: AppState,
    caller: Caller,
    body: ChatCompletionRequest | CompletionRequest,
    idempotency_key: str | None,
) -> Accepted:
    arrival = time.monotonic()
    info, model_name = await state.models.require(body.model)
    check_token_ids(info, body)
    tokenizer = await state.tokenizers.get(state.redis)
    if asks_for_output_checks(body):
        # NOTE: the meta-schema check of a large schema takes milliseconds (2.5 ms for a 30-property one).
        plan = await anyio.to_thread.run_sync(plan_output, body, tokenizer, state.settings)
    else:
        plan = NO_PLAN
    prompt_tokens = await count_prompt_tokens(tokenizer, body, plan.tools.tools if plan.tools else None)
    budget = token_budget(info, state.settings, body, prompt_tokens)
    # NOTE: a few requests at a time through the Redis part of the path (state.submit_turns). With
    # every request of a burst on it at once, asyncio interleaves them step by step and the first
    # XADD waits for every request's earlier steps; in turns the first ones reach the worker while
    # the rest are still on their way, and the last XADD is no later (the work is the same).
    async with state.submit_turns:
        outcome = await _enqueue(
            state, caller, body, idempotency_key, model_name, prompt_tokens, budget.max_tokens, plan
        )
    if isinstance(outcome, str):  # an earlier request with this Idempotency-Key
        return await _attach_existing(state, outcome)
    outcome.observer = RequestObserver(state.metrics, model_name, arrival)
    return outcome


async def _enqueue(
    state: AppState,
    caller: Caller,
    body: ChatCompletionRequest | CompletionRequest,
    idempotency_key: str | None,
    model_name: str,
    prompt_tokens: int | None,
    max_tokens: int,
    plan: OutputPlan,
) -> Accepted | str:
    """The new request, admitted and enqueued; or the id of the earlier request with this Idempotency-Key."""
    kind = kind_of(body)
    claim = idempotency.make_claim(state.keys, caller.owner, idempotency_key, kind, body)
    if claim is not None and (earlier := await idempotency.lookup(state.redis, claim)) is not None:
        return earlier

    queued_tokens = prompt_tokens if prompt_tokens is not None else 0
    await state.admission.check_rate(caller.owner, queued_tokens + max_tokens)
    request_id = new_request_id(kind)
    # deadline and created are stamped just before the message is sent (_stamped_fields).
    meta, message = build_request(
        body,
        request_id=request_id,
        owner=caller.owner,
        model_name=model_name,
        created=int(time.time()),
        prompt_tokens=queued_tokens,
        max_tokens=max_tokens,
        result_stream=state.keys.wire.result(request_id),
        priority=body.priority,
        plan=plan,
    )
    if claim is None:
        return await _enqueue_in_one_script(state, meta, message)
    return await _enqueue_with_key(state, claim, meta, message)


def _start_timeout_s(state: AppState) -> float:
    # The worker drops the request at its deadline; the slack covers a worker that died holding it.
    return state.settings.queue_timeout_s + START_SLACK_S


def _stamped_fields(state: AppState, message: RequestMessage) -> dict[str, str]:
    """Stamp the message's created time and queue deadline with now; return its XADD fields."""
    now = time.time()
    message.created = now
    message.deadline = now + state.settings.queue_timeout_s
    return encode_request(message)


async def _enqueue_in_one_script(state: AppState, meta: RequestMeta, message: RequestMessage) -> Accepted:
    """SUBSCRIBE, then one script admits the request, saves its meta and XADDs it: one round trip waited on.

    NOTE: the script goes out without waiting for the SUBSCRIBE's confirmation (its round trip was on the path
    to the worker, decision 0029); the relay waits for it before it reads the result stream, which holds
    every event published before Redis listened (api/events.py). A confirmation that never comes fails the
    stream with a resumable error, as a hub failure mid-stream does: the request itself was enqueued."""
    source: EventSource | None = None
    try:
        source = await open_source(state, meta, start_timeout_s=_start_timeout_s(state), confirmed=False)
        await state.admission.admit_and_enqueue(
            meta.request_id,
            meta.prompt_tokens,
            meta.owner,
            state.keys.meta(meta.request_id),
            meta.to_fields(),
            state.settings.result_ttl_s,
            state.keys.wire.requests,
            _stamped_fields(state, message),
        )
    except Overloaded:
        # The script refused and wrote nothing: the subscription is all there is to take back.
        with anyio.CancelScope(shield=True):
            if source is not None:
                await source.close()
        raise
    except BaseException as exc:
        # Whether the script ran is unknown (a timeout): _undo releases the queue entry if it did.
        await _give_up(state, meta.request_id, None, source, exc)
    return Accepted(meta, source, is_new=True)


async def _enqueue_with_key(
    state: AppState, claim: idempotency.IdempotencyClaim, meta: RequestMeta, message: RequestMessage
) -> Accepted | str:
    """Admit, bind the key, save the meta, SUBSCRIBE, XADD: one round trip each.

    NOTE: not one script like a request without a key: the bind must come after the admission (a
    refused request must not hold the key) and before any write (the loser of a race for the key
    attaches to the winner's request and writes nothing), and the bind's answer decides between them.
    """
    settings, redis, request_id = state.settings, state.redis, meta.request_id
    await state.admission.admit(request_id, meta.prompt_tokens, meta.owner)
    source: EventSource | None = None
    try:
        winner = await idempotency.bind(redis, claim, request_id, settings.result_ttl_s)
        if winner is not None:
            await state.admission.release(request_id)
            return winner
        await save_meta(redis, state.keys, meta, settings.result_ttl_s)
        source = await open_source(state, meta, start_timeout_s=_start_timeout_s(state))
        await redis.xadd(state.keys.wire.requests, _stamped_fields(state, message))
    except BaseException as exc:
        await _give_up(state, request_id, claim, source, exc)
    return Accepted(meta, source, is_new=True)
