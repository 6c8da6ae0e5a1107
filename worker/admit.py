"""Admission: turning delivered messages into engine requests, or into dead letters.

Every message ends in exactly one of these ways:
- a duplicate (another message already owns its request id): a dead letter, acknowledged; nothing
  is written to the id's result stream, which belongs to the owner;
- admitted: tokenized, resumed from its result stream if it has one, added to the engine;
- already complete (its result stream holds the terminal events): acknowledged only;
- cancelled before it started: "done"/"abort" events, acknowledged;
- deadline passed before it started: an error event, acknowledged;
- rejected (malformed, poison, or the engine refuses it with ValueError): an error event to the
  client when it has a valid id, a dead letter naming the reason, acknowledged.

A request id belongs to the first message that reaches admission with it: `SET {prefix}:owner:{id}
<message entry id> NX GET` in the admission's one round trip. The same entry delivered again (a worker
died before its XACK, a lease takeover) finds its own entry id there and resumes as before; a different
entry with the id finds another and is a duplicate, on any worker. The key expires with the result
stream (the publisher refreshes both), so an id is free again once its results are gone.
The result stream is always `{prefix}:result:{id}`: a message that names another is malformed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis

from worker.event_publisher import Batch, EventWrite
from worker.job import Job
from worker.protocol import (
    Keys,
    ProtocolError,
    RequestMessage,
    decode_request,
    encode_dead_letter,
    request_id_of,
)
from worker.resume import PriorOutput, parse_priors, queue_prior_reads
from worker.stream_reader import Delivery

logger = logging.getLogger(__name__)


@dataclass
class Admission:
    """The outcome of admitting a set of deliveries."""

    jobs: list[Job] = field(default_factory=list)
    batch: Batch = field(default_factory=Batch)
    num_dead_letters: int = 0
    num_rejected: int = 0


@dataclass
class _Candidate:
    delivery: Delivery
    request_id: str | None
    result_stream: str | None
    message: RequestMessage | None = None
    reason: str | None = None  # set: reject this one
    owner: str | None = None  # the entry id of the message that owns request_id, when another one does


def _num_choices(message: RequestMessage) -> int:
    n = message.params.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


class Admitter:
    """Args:
    engine: the LLMEngine (tokenizer, add_request).
    client: Redis client (reads result streams and cancel keys).
    keys: key names.
    consumer: this worker's consumer name (marks its events).
    max_deliveries: a message delivered more often than this is poison.
    result_ttl_s: how long a request id stays owned after admission (the publisher extends it while the
        request's result stream is written: the two expire together).
    """

    def __init__(
        self, engine, client: redis.Redis, keys: Keys, consumer: str, max_deliveries: int, result_ttl_s: int
    ) -> None:
        self.engine = engine
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.max_deliveries = max_deliveries
        self.result_ttl_s = result_ttl_s

    def admit(self, deliveries: list[Delivery], active_request_ids: set[str]) -> Admission:
        """Admit deliveries; Redis reads happen here, writes go into the returned batch.

        # NOTE: every Redis read comes before the engine is touched, so when a read fails (Redis
        # down) nothing has changed and the same deliveries can be admitted again later.
        """
        out = Admission()
        candidates = []
        for delivery in deliveries:
            if delivery.fields is None:  # deleted from the stream while pending: nothing to do
                out.batch.acks.append(delivery.message_id)
                continue
            candidates.append(self._parse(delivery))
        with_stream = [c for c in candidates if c.result_stream is not None]
        streams = [c.result_stream for c in with_stream]
        valid_ids = sorted({c.request_id for c in candidates if c.reason is None})
        prior_list, cancelled = self._read_priors_and_cancels(streams, valid_ids, with_stream)
        priors = dict(zip(map(id, with_stream), prior_list))
        active = set(active_request_ids)  # grows as this batch is admitted: one id, one job
        for candidate in candidates:
            prior = priors.get(id(candidate), PriorOutput())
            if candidate.owner is not None:
                self._refuse_duplicate(out, candidate)
                continue
            if candidate.message is not None and prior.is_complete(_num_choices(candidate.message)):
                out.batch.acks.append(candidate.delivery.message_id)  # finished by a worker that died before XACK
                continue
            if candidate.reason is not None:
                self._reject(out, candidate, prior, candidate.reason)
                continue
            self._admit_one(out, candidate, prior, candidate.request_id in cancelled, active)
        return out

    def _parse(self, delivery: Delivery) -> _Candidate:
        fields = delivery.fields
        request_id = request_id_of(fields)
        # NOTE: the result stream is derived from the id, never taken from the message: a worker writes only
        # into the stream of a request it owns (see the module's docstring), and a message naming another
        # request's stream would otherwise write into it.
        stream = self.keys.result(request_id) if request_id is not None else None
        candidate = _Candidate(delivery, request_id, stream)
        try:
            candidate.message = decode_request(fields)
            named = candidate.message.result_stream
            if named is not None and named != stream:
                raise ProtocolError(
                    "result_stream", f"must be {stream!r} (the request's own) or absent, got {named[:80]!r}"
                )
        except ProtocolError as exc:
            candidate.reason = f"invalid message: {exc}"
        except Exception as exc:  # never let one message take the worker down
            logger.exception("cannot parse message %s", delivery.message_id)
            candidate.reason = f"invalid message: {type(exc).__name__}: {exc}"
        if delivery.delivery_count > self.max_deliveries:
            candidate.reason = (
                f"poison: delivered {delivery.delivery_count} times (max_deliveries is {self.max_deliveries})"
            )
        return candidate

    def _read_priors_and_cancels(
        self, streams: list[str], request_ids: list[str], with_stream: list[_Candidate]
    ) -> tuple[list[PriorOutput], set[str]]:
        """What each result stream already holds, and which of the requests were cancelled: one round trip,
        which also claims each candidate's request id (sets `owner` on the candidates that are duplicates)."""
        # NOTE: one pipeline, not two: at low load the admission's reads lie on the path to the first token
        # (decision 0029), and each round trip is one more wait on Redis before the prefill starts.
        if not streams and not request_ids:
            return [], set()
        pipe = self.client.pipeline(transaction=False)
        queue_prior_reads(pipe, streams)
        if request_ids:
            pipe.mget([self.keys.cancel(i) for i in request_ids])
        for candidate in with_stream:
            # NX GET: set if free, and either way hand back what was there (Redis >= 7.0)
            owner_key = self.keys.owner(candidate.request_id)
            pipe.set(owner_key, candidate.delivery.message_id, nx=True, get=True, ex=self.result_ttl_s)
        results = pipe.execute(raise_on_error=False)
        priors = parse_priors(streams, results[: len(streams)])
        owners = results[len(streams) + bool(request_ids) :]
        for candidate, owner in zip(with_stream, owners, strict=True):
            if isinstance(owner, Exception):
                raise owner
            owner = owner.decode() if isinstance(owner, bytes) else owner
            if owner is not None and owner != candidate.delivery.message_id:
                candidate.owner = owner
        if not request_ids:
            return priors, set()
        values = results[len(streams)]
        if isinstance(values, Exception):
            raise values
        return priors, {i for i, value in zip(request_ids, values, strict=True) if value is not None}

    def _admit_one(
        self, out: Admission, candidate: _Candidate, prior: PriorOutput, cancelled: bool, active: set[str]
    ) -> None:
        message = candidate.message
        delivery = candidate.delivery
        n = _num_choices(message)
        if message.id in active:
            # Two messages with one id: the second must not touch the first's result stream.
            out.batch.dead_letters.append(
                encode_dead_letter(
                    message.id, "duplicate: a request with this id is running", delivery.message_id, delivery.fields
                )
            )
            out.batch.acks.append(delivery.message_id)
            out.num_dead_letters += 1
            return
        job = Job(
            request_id=message.id,
            message_id=delivery.message_id,
            result_stream=candidate.result_stream,
            events_channel=self.keys.events(message.id),
            n=n,
            num_prompt_tokens=0,
            next_seq=prior.next_seq,
            deadline=message.deadline,
            started=prior.has_output,
            skip_indices=set(prior.done_indices),
            completion_tokens={i: len(t) for i, t in prior.token_ids.items()},
            whole=message.whole,
            priority=message.priority,
        )
        if cancelled:
            for index in sorted(set(range(n)) - job.skip_indices):
                self._emit(out.batch, job, job.done_event(index, "abort", None, self.consumer))
            out.batch.acks.append(delivery.message_id)
            return
        if message.deadline is not None and not prior.has_output and time.time() > message.deadline:
            late = time.time() - message.deadline
            self._emit(
                out.batch,
                job,
                job.error_event(f"deadline passed {late:.3f}s before the request started", self.consumer),
            )
            out.batch.acks.append(delivery.message_id)
            out.num_rejected += 1
            return
        try:
            prompt_ids = self._prompt_token_ids(message)
            job.num_prompt_tokens = len(prompt_ids)
            params = self.engine.sampling_params(message.params)  # the model's defaults where params are silent
            self.engine.add_request(
                message.id, prompt_ids, params, priority=message.priority, prior_output_token_ids=prior.engine_prior(n)
            )
        except (ValueError, TypeError) as exc:
            self._reject(out, candidate, prior, f"rejected by the engine: {exc}")
            return
        except Exception as exc:  # a template or tokenizer failure is this message's problem, not the worker's
            logger.exception("admitting %s failed", message.id)
            self._reject(out, candidate, prior, f"cannot prepare the request: {type(exc).__name__}: {exc}")
            return
        out.jobs.append(job)
        active.add(message.id)

    def _prompt_token_ids(self, message: RequestMessage) -> list[int]:
        if message.prompt_token_ids is not None:
            return list(message.prompt_token_ids)
        if message.messages is not None:
            return list(self.engine.apply_chat_template(message.messages, tools=message.tools))
        return list(self.engine.encode(message.prompt))

    def _refuse_duplicate(self, out: Admission, candidate: _Candidate) -> None:
        """A second message with an id another message owns: a dead letter only (the id's result stream is
        the owner's), acknowledged."""
        delivery = candidate.delivery
        reason = (
            f"duplicate: request id {candidate.request_id!r} belongs to message {candidate.owner} (running, or "
            "finished with its result stream not yet expired); use a new id"
        )
        logger.warning("dead letter %s (%s): %s", candidate.request_id, delivery.message_id, reason)
        out.batch.dead_letters.append(
            encode_dead_letter(candidate.request_id, reason, delivery.message_id, delivery.fields)
        )
        out.batch.acks.append(delivery.message_id)
        out.num_dead_letters += 1

    def _reject(self, out: Admission, candidate: _Candidate, prior: PriorOutput, reason: str) -> None:
        delivery = candidate.delivery
        logger.warning("dead letter %s (%s): %s", candidate.request_id, delivery.message_id, reason)
        if candidate.request_id is not None and not prior.errored:
            job = Job(
                request_id=candidate.request_id,
                message_id=delivery.message_id,
                result_stream=candidate.result_stream,
                events_channel=self.keys.events(candidate.request_id),
                n=1,
                num_prompt_tokens=0,
                next_seq=prior.next_seq,
            )
            self._emit(out.batch, job, job.error_event(reason, self.consumer))
        out.batch.dead_letters.append(
            encode_dead_letter(candidate.request_id, reason, delivery.message_id, delivery.fields)
        )
        out.batch.acks.append(delivery.message_id)
        out.num_dead_letters += 1

    @staticmethod
    def _emit(batch: Batch, job: Job, event) -> None:
        batch.events.append(EventWrite(job.request_id, job.result_stream, job.events_channel, event))
