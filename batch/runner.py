"""Running one batch: validate its input, feed its lines into the request stream a few at a time, collect
their answers, finalize.

Exactly once per line, across runner deaths:
- a line is sent in one transaction with its entry in `{prefix}:batch:sent:{id}` (its request id is a
  function of batch and line), so a new runner re-attaches to every line sent before and sends none twice;
- a line's answer is recorded with HSETNX beside its count (batch/line_records.py), so no line is written
  or counted twice, and the files are written from those records at the end.
At most `batch_in_flight` lines are in the request stream or running at once, at the wire priority
`batch_priority`, and a line is sent only while fewer than `batch_queue_ahead` messages wait unread in the stream
(batch/stream_room.py): interactive requests never queue behind more than that, and run first once read.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque

from redis import Redis

from api.errors import ApiError
from api.request_meta import RequestMeta
from api.settings import ApiSettings
from batch.batch_store import CANCELLING, EXPIRED, FAILED, FINALIZING, IN_PROGRESS, TERMINAL, VALIDATING, BatchStore
from batch.file_store import FileStore
from batch.finalize import COMPLETED, finalize
from batch.ids import line_request_id
from batch.input_lines import InputLine, LineError, parse_lines
from batch.keys import BatchKeys
from batch.lease import BatchLease
from batch.line_records import LineRecords
from batch.line_requests import prepare
from batch.line_results import LineAnswer, LineResults
from batch.output_lines import BATCH_CANCELLED, BATCH_EXPIRED, error_line, response_line
from batch.served_model import ServedModel
from batch.settings import BatchSettings
from batch.stream_room import StreamRoom
from worker.protocol import DEFAULT_CANCEL_TTL_S, Keys, encode_request

log = logging.getLogger("inferq.batch")

READ_BLOCK_MS = 200
# While lines wait to be sent, a read waits this long at most: lines answer as whole choices (one event each),
# so no token event wakes the runner when the workers empty the stream, and the stream's room is looked at again.
FEED_BLOCK_MS = 10
MODEL_REFRESH_S = 1.0


class BatchRunner:
    def __init__(self, redis: Redis, settings: BatchSettings, api_settings: ApiSettings, batch_id: str) -> None:
        self.redis = redis
        self.settings = settings
        self.api_settings = api_settings
        self.batch_id = batch_id
        self.keys = BatchKeys(settings.prefix)
        self.wire = Keys(settings.prefix)
        self.store = BatchStore(redis, self.keys)
        self.lines = LineRecords(redis, self.keys, batch_id)
        self.files = FileStore(redis, self.keys, settings.files_dir, settings.files_ttl_s)
        self.served = ServedModel(redis, self.wire)
        self.results = LineResults(redis)
        self.room = StreamRoom(redis, self.wire, settings.batch_queue_ahead)

    def run(self) -> str:
        """Run the batch to its end, unless another runner holds it ('held') or it ended before."""
        lease = BatchLease(self.redis, self.keys.lease(self.batch_id), self.settings.batch_lease_s)
        if not lease.acquire():
            return "held"
        try:
            return self._run(lease)
        finally:
            lease.release()

    # ---- steps ----------------------------------------------------------------------------------------

    def _run(self, lease: BatchLease) -> str:
        record = self.store.get(self.batch_id)
        if record is None or record["status"] in TERMINAL:
            return record["status"] if record else "missing"
        owner = record["owner"]
        if record["status"] == FINALIZING:
            return finalize(self.store, self.lines, self.files, self.batch_id, owner, COMPLETED)
        lines = self._input(record)
        if lines is None:
            return FAILED
        if not record.get("in_progress_at"):  # validating (or cancelled while validating): count the lines
            self._validated(lines)
        return self._feed_and_collect(lease, record, [p for p in lines if isinstance(p, InputLine)])

    def _fail(self, code: str, message: str, param: str | None = None) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message, "param": param, "line": None}]}
        now = str(int(time.time()))
        self.store.transition(self.batch_id, (VALIDATING, CANCELLING), status=FAILED, failed_at=now, errors=errors)

    def _input(self, record: dict[str, str]) -> list[InputLine | LineError] | None:
        """The input file's lines; None (and the batch failed) when the file cannot be run at all."""
        file_id = record["input_file_id"]
        try:
            data = self.files.read(file_id)
        except FileNotFoundError:
            self._fail("file_not_found", f"the input file {file_id} no longer exists", "input_file_id")
            return None
        lines = parse_lines(data, record["endpoint"])
        if not lines:
            self._fail("empty_file", f"the input file {file_id} has no lines", "input_file_id")
            return None
        if len(lines) > self.settings.batch_max_lines:
            message = f"the input file has {len(lines)} lines, over the limit of {self.settings.batch_max_lines}"
            self._fail("too_many_requests", message + " (INFERQ_BATCH_MAX_LINES)", "input_file_id")
            return None
        return lines

    def _validated(self, lines: list[InputLine | LineError]) -> None:
        for item in lines:
            if isinstance(item, LineError):
                text = error_line(self.batch_id, item.line, item.custom_id, item.code, item.message)
                self.lines.record(item.line, text, succeeded=False)
        total = str(len(lines))
        self.store.transition(self.batch_id, (VALIDATING, CANCELLING), total=total)
        now = str(int(time.time()))
        self.store.transition(self.batch_id, (VALIDATING,), status=IN_PROGRESS, in_progress_at=now)

    def _feed_and_collect(self, lease: BatchLease, record: dict[str, str], runnable: list[InputLine]) -> str:
        owner, endpoint, expires_at = record["owner"], record["endpoint"], int(record["expires_at"])
        recorded = self.lines.numbers()
        sent = self.redis.hgetall(self.keys.sent(self.batch_id))
        by_line = {item.line: item for item in runnable}
        self.served.refresh()
        refreshed = time.monotonic()
        for line, meta_json in sent.items():
            if int(line) not in recorded:
                meta = RequestMeta.from_fields(json.loads(meta_json))
                self.results.add(int(line), by_line[int(line)].custom_id, meta, self.served.texts)
        if self.results.in_flight:
            log.info("batch %s: re-attached to %d lines in flight", self.batch_id, len(self.results.in_flight))
        pending = deque(item for item in runnable if item.line not in recorded and str(item.line) not in sent)
        cancelling = False
        while True:
            if not lease.renew():
                log.warning("batch %s: lease lost; another runner holds it", self.batch_id)
                return "lost"
            status = self.redis.hget(self.keys.batch(self.batch_id), "status")
            if status == CANCELLING and not cancelling:
                cancelling = True
                pending.clear()
                self._cancel_in_flight()
            if time.time() >= expires_at:
                self._cancel_in_flight()
                for item in [*pending, *self.results.lines()]:
                    text = error_line(self.batch_id, item.line, item.custom_id, BATCH_EXPIRED, "the batch expired")
                    self.lines.record(item.line, text, succeeded=False)
                return finalize(self.store, self.lines, self.files, self.batch_id, owner, EXPIRED)
            if time.monotonic() - refreshed > MODEL_REFRESH_S:
                self.served.refresh()
                refreshed = time.monotonic()
            if pending and self.served.info:
                for _ in range(self._sendable(len(pending))):
                    self._send(pending.popleft(), owner, endpoint, expires_at)
            if not pending and not self.results.in_flight:
                return finalize(self.store, self.lines, self.files, self.batch_id, owner, COMPLETED)
            if not self.results.in_flight:
                time.sleep((FEED_BLOCK_MS if self.served.info else READ_BLOCK_MS) / 1000)  # a full stream, or no model
                continue
            feeding = pending and len(self.results.in_flight) < self.settings.batch_in_flight
            for answer in self.results.read(FEED_BLOCK_MS if feeding else READ_BLOCK_MS):
                self._record(answer, cancelling)

    def _sendable(self, num_pending: int) -> int:
        """Lines to send now: within `batch_in_flight`, and only into the room the request stream has."""
        slots = min(num_pending, self.settings.batch_in_flight - len(self.results.in_flight))
        return min(slots, self.room.room()) if slots > 0 else 0

    def _send(self, item: InputLine, owner: str, endpoint: str, expires_at: int) -> None:
        kind = "chat" if endpoint == "/v1/chat/completions" else "completion"
        request_id = line_request_id(self.batch_id, item.line, kind)
        try:
            meta, message = prepare(
                endpoint, item.body, request_id=request_id, owner=owner, served=self.served,
                settings=self.api_settings, wire=self.wire, priority=self.settings.batch_priority,
            )  # fmt: skip
        except ApiError as err:
            text = response_line(self.batch_id, item.line, item.custom_id, err.status, None, err.body())
            self.lines.record(item.line, text, succeeded=False)
            return
        message.created = time.time()
        message.deadline = float(expires_at)  # a line not started by the batch's expiry is dropped by the worker
        # The runner reads whole answers only: the worker writes a choice's output as one event when it ends,
        # not an event a token, which spares the worker, Redis and the runner most of a batch's writes and reads.
        message.whole = True
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.wire.requests, encode_request(message))
        pipe.hset(self.keys.sent(self.batch_id), str(item.line), json.dumps(meta.to_fields()))
        pipe.execute()
        self.results.add(item.line, item.custom_id, meta, self.served.texts)

    def _record(self, answer: LineAnswer, cancelling: bool) -> None:
        if answer.aborted and cancelling:
            message = "the batch was cancelled before this line finished"
            text = error_line(self.batch_id, answer.line, answer.custom_id, BATCH_CANCELLED, message)
        else:
            text = response_line(
                self.batch_id, answer.line, answer.custom_id, answer.status, answer.request_id, answer.body
            )
        self.lines.record(answer.line, text, succeeded=answer.status == 200)

    def _cancel_in_flight(self) -> None:
        lines = self.results.lines()
        if not lines:
            return
        pipe = self.redis.pipeline(transaction=False)
        for item in lines:
            pipe.set(self.wire.cancel(item.meta.request_id), "1", ex=DEFAULT_CANCEL_TTL_S)
        pipe.incrby(self.wire.cancels, 1)
        pipe.execute()
