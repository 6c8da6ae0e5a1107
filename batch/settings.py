"""Settings of the Batch API: the file store (shared by the API and the batch workers) and the batch runner.

Environment prefix INFERQ_ (docs/settings.md lists them). The API and the Celery workers must agree on
`files_dir`, `redis_url` and `prefix`.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BatchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore", frozen=True)

    redis_url: str = "redis://localhost:6379/0"
    prefix: str = Field("inferq", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    # Uploaded input files and generated output/error files (a volume in Compose); metadata in Redis.
    files_dir: str = "~/.cache/inferq/files"
    # An uploaded file over this many bytes is refused (400, param "file").
    max_file_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    # A batch input file of more lines fails its batch (OpenAI's limit is 50,000).
    batch_max_lines: int = Field(50_000, ge=1)
    # Files (uploaded and generated) and batch records are deleted this long after creation.
    files_ttl_s: int = Field(30 * 24 * 3600, ge=60)
    # A batch's lines in the request stream or running at once, per batch (lines whose answers its runner
    # follows); a few more than the workers' sequence slots keep them full.
    batch_in_flight: int = Field(512, ge=1, le=100_000)
    # A runner sends a line only while fewer messages than this wait unread in the request stream (any
    # submitter's, batch/stream_room.py): no interactive request queues behind more than this many lines.
    batch_queue_ahead: int = Field(8, ge=1, le=100_000)
    # The wire `priority` of batch lines: interactive requests (priority 0) run first under the workers'
    # `priority` scheduling policy.
    batch_priority: int = Field(1000, ge=-(2**31 - 1), le=2**31 - 1)
    # The runner of a batch holds its lease this long without renewal; a runner that died is replaced
    # once it lapses (by the sweep).
    batch_lease_s: float = Field(15.0, gt=0)
    # How often each batch worker sweeps: expired files and batches deleted, batches whose runner died
    # sent to a new one. Several workers sweep at most once per interval together (a Redis lock).
    batch_sweep_interval_s: float = Field(30.0, gt=0)
