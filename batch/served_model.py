"""What the workers serve, read from their Redis records (sync): the model record and the tokenizer, which
the batch runner needs to check and shape a line's request exactly as the API does."""

from __future__ import annotations

import logging

from redis import Redis

from api.logprob_format import TokenTexts, token_texts
from api.tokens import PromptTokenizer
from worker.protocol import Keys, ModelInfo

log = logging.getLogger("inferq.batch")


class ServedModel:
    def __init__(self, redis: Redis, wire: Keys) -> None:
        self.redis = redis
        self.wire = wire
        self.info: ModelInfo | None = None
        self.tokenizer: PromptTokenizer | None = None
        self.texts: TokenTexts = token_texts(None)

    def refresh(self) -> None:
        """Re-read the model record; reload the tokenizer when its digest changed."""
        raw = self.redis.get(self.wire.model)
        try:
            self.info = ModelInfo.from_json(raw) if raw else None
        except (ValueError, TypeError):
            self.info = None
        digest = self.redis.hget(self.wire.tokenizer, "sha256")
        if digest is None:
            self.tokenizer = None
        elif self.tokenizer is None or self.tokenizer.digest != digest:
            try:
                self.tokenizer = PromptTokenizer.from_fields(self.redis.hgetall(self.wire.tokenizer))
            except Exception as exc:  # a broken publication: lines wait for a good one
                log.error("cannot load the published tokenizer: %s", exc)
                self.tokenizer = None
        self.texts = token_texts(self.tokenizer)
