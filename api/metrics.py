"""Prometheus metrics of the API, under vLLM's names where vLLM has one (existing dashboards work).

vLLM names (label `model_name`), measured here at the edge, as the client sees them:
    vllm:time_to_first_token_seconds     admission -> first token event           histogram
    vllm:inter_token_latency_seconds     between consecutive token events         histogram
    vllm:time_per_output_token_seconds   (e2e - ttft) / (output tokens - 1)        histogram
    vllm:e2e_request_latency_seconds     admission -> last event                  histogram
    vllm:request_queue_time_seconds      admission -> first event of any kind; an upper bound
                                         of the worker's queue time (it includes the prefill)
    vllm:num_requests_running/waiting    summed over live workers' heartbeats      gauges
    vllm:prompt_tokens_total, vllm:generation_tokens_total (from usage)           counters
    vllm:request_success_total{finished_reason}                                    counter
inferq's own (no vLLM equivalent):
    inferq_api_rejected_requests_total{reason}   401/400/429/503 answered before enqueueing
    inferq_api_queued_requests, inferq_api_queued_prompt_tokens   the admission queue
    inferq_api_live_workers
Each app has its own registry so several apps can live in one process (tests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Buckets as vLLM uses them (seconds).
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", m, buckets=_TTFT, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", m, buckets=_ITL, registry=r)
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Mean time per output token of a request.",
            m,
            buckets=_ITL,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", m, buckets=_E2E, registry=r
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Admission to first event (upper bound of queue time).",
            m,
            buckets=_E2E,
            registry=r,
        )
        self.running = Gauge("vllm:num_requests_running", "Requests running on the workers.", m, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting in the workers.", m, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", m, registry=r)
        self.success = Counter(
            "vllm:request_success", "Finished requests by finish reason.", m + ["finished_reason"], registry=r
        )
        self.rejected = Counter(
            "inferq_api_rejected_requests", "Requests answered with an error before enqueueing.", ["reason"], registry=r
        )
        self.queued_requests = Gauge("inferq_api_queued_requests", "Admitted, not yet started requests.", registry=r)
        self.queued_tokens = Gauge(
            "inferq_api_queued_prompt_tokens", "Prompt tokens in the admission queue.", registry=r
        )
        self.live_workers = Gauge("inferq_api_live_workers", "Workers with a live heartbeat.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestObserver:
    """Timings of one request as this replica relays it (only the replica that admitted it observes)."""

    def __init__(self, metrics: ApiMetrics, model: str, arrival: float) -> None:
        self.metrics = metrics
        self.model = model
        self.arrival = arrival
        self.first_event_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.num_tokens = 0

    def on_event(self, event_type: str, num_tokens: int, now: float) -> None:
        if self.first_event_at is None:
            self.first_event_at = now
            self.metrics.queue_time.labels(self.model).observe(now - self.arrival)
        if event_type != "token" or num_tokens == 0:
            return
        if self.first_token_at is None:
            self.first_token_at = now
            self.metrics.ttft.labels(self.model).observe(now - self.arrival)
        elif self.last_token_at is not None:
            self.metrics.itl.labels(self.model).observe(now - self.last_token_at)
        self.last_token_at = now
        self.num_tokens += num_tokens

    def on_finish(self, finish_reasons: list[str], usage: dict[str, int] | None, now: float) -> None:
        self.metrics.e2e.labels(self.model).observe(now - self.arrival)
        if self.first_token_at is not None and self.num_tokens > 1 and self.last_token_at is not None:
            self.metrics.tpot.labels(self.model).observe(
                (self.last_token_at - self.first_token_at) / (self.num_tokens - 1)
            )
        for reason in finish_reasons:
            self.metrics.success.labels(self.model, reason).inc()
        if usage:
            self.metrics.prompt_tokens.labels(self.model).inc(usage.get("prompt_tokens", 0))
            self.metrics.generation_tokens.labels(self.model).inc(usage.get("completion_tokens", 0))
