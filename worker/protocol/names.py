"""Names and constants of the wire contract: every stream, group, key and channel name in one place."""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass

PROTOCOL_VERSION = "1"
DEFAULT_PREFIX = "inferq"
DEFAULT_RESULT_TTL_S = 3600  # result streams expire this long after their last write
DEFAULT_CANCEL_TTL_S = 3600
DEFAULT_HEARTBEAT_TTL_S = 10
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0

MAX_REQUEST_ID_CHARS = 128
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_RESULT_STREAM_CHARS = 512

# Keys of `params`: the engine's SamplingParams fields. Kept here (not imported) so the API
# can validate without the engine; a test checks both lists agree.
SAMPLING_PARAM_FIELDS = frozenset({
    "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logit_bias", "seed", "stop", "stop_token_ids", "max_tokens", "min_tokens", "ignore_eos", "logprobs",
    "skip_special_tokens", "prompt_logprobs", "speculative", "structured_output",
})  # fmt: skip

EVENT_TYPES = ("token", "done", "error")
FINISH_REASONS = ("stop", "length", "abort", "error")


class ProtocolError(ValueError):
    """A message that breaks the contract. `field` names the offending field, `reason` says how."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


@dataclass(frozen=True)
class Keys:
    """Every Redis name inferq uses, derived from one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def requests(self) -> str:
        return f"{self.prefix}:requests"

    @property
    def group(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def tokenizer(self) -> str:
        """Hash each worker writes at start (see records.tokenizer_fields): the API counts tokens with it."""
        return f"{self.prefix}:tokenizer"

    @property
    def model(self) -> str:
        return f"{self.prefix}:model"

    @property
    def worker_pattern(self) -> str:
        """SCAN MATCH pattern that finds every live worker's heartbeat key."""
        return f"{self.prefix}:worker:*"

    def result(self, request_id: str) -> str:
        return f"{self.prefix}:result:{request_id}"

    def events(self, request_id: str) -> str:
        return f"{self.prefix}:events:{request_id}"

    def owner(self, request_id: str) -> str:
        """The request stream entry id of the message that owns this request id (SET NX at admission, expiring
        with its result stream): a different message with the same id is a duplicate, see worker/admit.py."""
        return f"{self.prefix}:owner:{request_id}"

    def cancel(self, request_id: str) -> str:
        return f"{self.prefix}:cancel:{request_id}"

    @property
    def cancels(self) -> str:
        """Counter every canceller INCRs after setting a cancel key: workers read the running
        requests' cancel keys when it moves (and every 50 ms regardless), see worker/cancel.py."""
        return f"{self.prefix}:cancels"

    def worker(self, consumer: str) -> str:
        return f"{self.prefix}:worker:{consumer}"


def make_consumer_name() -> str:
    """A consumer name unique per process: hostname-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def stream_id(seq: int) -> str:
    """The explicit result-stream entry id of event `seq` (seq >= 1)."""
    return f"0-{seq}"


def seq_from_stream_id(entry_id: str | bytes) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1])
