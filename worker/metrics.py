"""Prometheus metrics of one worker, in their own registry (several workers can share a process in tests).

Served on `metrics_port` (0: not served). Gauges that need Redis (queue depth) are refreshed by
the heartbeat thread, never by the engine loop.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

STEP_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("inferq_queue_depth", "Request messages not yet delivered to any worker.", registry=r)
        self.queue_pending = Gauge(
            "inferq_queue_pending", "Messages delivered but not acknowledged (all workers).", registry=r
        )
        self.running = Gauge("inferq_worker_running_requests", "Requests the engine is running.", registry=r)
        self.waiting = Gauge("inferq_worker_waiting_requests", "Requests waiting in the engine.", registry=r)
        self.kv_usage = Gauge("inferq_worker_kv_usage_ratio", "Fraction of KV blocks in use.", registry=r)
        self.free_kv_tokens = Gauge("inferq_worker_free_kv_tokens", "Free KV cache capacity in tokens.", registry=r)
        self.prefix_hit_rate = Gauge("inferq_worker_prefix_cache_hit_rate", "Prefix cache hit rate.", registry=r)
        self.tokens_per_s = Gauge("inferq_worker_generation_tokens_per_second", "Recent generation rate.", registry=r)
        self.generated_tokens = Counter("inferq_worker_generated_tokens", "Tokens generated.", registry=r)
        self.step_seconds = Histogram(
            "inferq_worker_step_seconds", "Time of one engine step.", buckets=STEP_SECONDS_BUCKETS, registry=r
        )
        # speculative decoding, vLLM's spec_decode_* names (zero while it is off)
        self.spec_drafts = Counter(
            "inferq_spec_decode_num_drafts", "Proposals verified (one per speculating request and step).", registry=r
        )
        self.spec_draft_tokens = Counter("inferq_spec_decode_num_draft_tokens", "Proposed tokens verified.", registry=r)
        self.spec_accepted_tokens = Counter(
            "inferq_spec_decode_num_accepted_tokens", "Proposed tokens kept (equal to the model's own).", registry=r
        )
        self.spec_accepted_per_pos = Counter(
            "inferq_spec_decode_num_accepted_tokens_per_pos",
            "Proposed tokens kept, by position in the proposal (0 first).",
            ["position"],
            registry=r,
        )
        self.preemptions = Counter("inferq_worker_preemptions", "Requests preempted (recomputed later).", registry=r)
        self.admitted = Counter("inferq_worker_requests_admitted", "Requests added to the engine.", registry=r)
        self.finished = Counter(
            "inferq_worker_requests_finished", "Requests finished, by reason.", ["reason"], registry=r
        )
        self.aborts = Counter("inferq_worker_aborts", "Requests cancelled by their client.", registry=r)
        self.dead_letters = Counter(
            "inferq_worker_dead_letters", "Messages moved to the dead-letter stream.", registry=r
        )
        self.lost = Counter(
            "inferq_worker_requests_lost", "Requests another worker took over from this one.", registry=r
        )
        self.events_written = Counter("inferq_worker_events_written", "Result events written.", registry=r)
        # read at each scrape (worker/loop.py sets its function to the publisher's count): a backlog here means
        # tokens reach their clients late, whatever the engine's speed
        self.unwritten_batches = Gauge(
            "inferq_worker_unwritten_event_batches",
            "Steps' result events handed to the publisher and not yet written to Redis.",
            registry=r,
        )
        self.duplicate_events = Counter(
            "inferq_worker_duplicate_events", "Result events already present (retries, resumes).", registry=r
        )
        self.lease_renewals = Counter("inferq_worker_lease_renewals", "Leases renewed on held messages.", registry=r)
        self.redis_errors = Counter("inferq_worker_redis_errors", "Failed Redis calls of the engine loop.", registry=r)

        self._rate_since = time.monotonic()
        self._rate_tokens: int | None = None

    def observe_stats(self, stats, previous=None) -> None:
        """Refresh gauges from EngineStats; with `previous`, count what happened since (one step)."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.free_kv_tokens.set(stats.num_free_kv_tokens)
        self.prefix_hit_rate.set(stats.prefix_cache_hit_rate)
        if previous is None:
            return
        self.generated_tokens.inc(max(0, stats.num_generated_tokens - previous.num_generated_tokens))
        self.preemptions.inc(max(0, stats.num_preemptions - previous.num_preemptions))
        if stats.spec_num_drafts != previous.spec_num_drafts:
            self._observe_spec_decode(stats, previous)
        now = time.monotonic()
        if self._rate_tokens is None:
            self._rate_since, self._rate_tokens = now, previous.num_generated_tokens
        if now - self._rate_since >= 1.0:  # tokens/s over roughly the last second
            self.tokens_per_s.set((stats.num_generated_tokens - self._rate_tokens) / (now - self._rate_since))
            self._rate_since, self._rate_tokens = now, stats.num_generated_tokens

    def _observe_spec_decode(self, stats, previous) -> None:
        self.spec_drafts.inc(stats.spec_num_drafts - previous.spec_num_drafts)
        self.spec_draft_tokens.inc(stats.spec_num_draft_tokens - previous.spec_num_draft_tokens)
        self.spec_accepted_tokens.inc(stats.spec_num_accepted_tokens - previous.spec_num_accepted_tokens)
        before = previous.spec_accepted_per_position or (0,) * len(stats.spec_accepted_per_position)
        for position, (now, then) in enumerate(zip(stats.spec_accepted_per_position, before, strict=True)):
            if now != then:
                self.spec_accepted_per_pos.labels(position=str(position)).inc(now - then)

    def serve(self, port: int) -> None:
        """Serve /metrics on `port` (a daemon thread); 0 does nothing."""
        if not port:
            return
        try:
            start_http_server(port, registry=self.registry)
        except OSError as exc:  # a taken port must not keep a GPU worker from serving
            logger.error("cannot serve metrics on port %d (%s); set INFERQ_METRICS_PORT per worker", port, exc)
