"""The end of a batch: its recorded lines written to the output file (200 responses) and the error file
(every other line), in input order, then the final status. Idempotent: a runner that dies half-way is
replaced by one that writes the same files under the same ids (batch/ids.py)."""

from __future__ import annotations

import time

from batch.batch_store import CANCELLED, CANCELLING, COMPLETED, EXPIRED, FINALIZING, IN_PROGRESS, BatchStore
from batch.file_store import BATCH_OUTPUT, FileStore
from batch.ids import error_file_id, output_file_id
from batch.line_records import LineRecords
from batch.output_lines import is_success

_TIMESTAMP = {COMPLETED: "completed_at", CANCELLED: "cancelled_at", EXPIRED: "expired_at"}


def _jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def finalize(store: BatchStore, lines: LineRecords, files: FileStore, batch_id: str, owner: str, ending: str) -> str:
    """Write the files and set the final status (`ending`, or cancelled when a cancel came first)."""
    now = str(int(time.time()))
    if ending == COMPLETED:
        store.transition(batch_id, (IN_PROGRESS,), status=FINALIZING, finalizing_at=now)
    current = store.get(batch_id)
    if current is not None and current["status"] == CANCELLING:
        ending = CANCELLED
    recorded = lines.all()
    texts = [recorded[line] for line in sorted(recorded)]
    outputs = [text for text in texts if is_success(text)]
    errors = [text for text in texts if not is_success(text)]
    fields = {"status": ending, _TIMESTAMP[ending]: str(int(time.time())), "output_file_id": "", "error_file_id": ""}
    if outputs:
        fields["output_file_id"] = output_file_id(batch_id)
        files.write(fields["output_file_id"], owner, f"{batch_id}_output.jsonl", BATCH_OUTPUT, _jsonl(outputs))
    if errors:
        fields["error_file_id"] = error_file_id(batch_id)
        files.write(fields["error_file_id"], owner, f"{batch_id}_error.jsonl", BATCH_OUTPUT, _jsonl(errors))
    store.transition(batch_id, (IN_PROGRESS, FINALIZING, CANCELLING), **fields)
    store.redis.delete(store.keys.lines(batch_id), store.keys.sent(batch_id))
    return ending
