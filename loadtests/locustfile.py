"""Load tests of inferq with LLM metrics, for Locust.

    locust -f loadtests/locustfile.py --host http://localhost:8000               # web UI on :8089
    locust -f loadtests/locustfile.py --host http://localhost:8000 --headless -u 32 -r 8 -t 2m \\
        --csv results/run --html results/run.html ChatStreamUser

Two user classes (name them on the command line to run only one):
- ChatStreamUser: POST /v1/chat/completions with stream: true, read the SSE stream.
- RedisJobUser: XADD a job straight onto the request stream (the wire contract in the README)
  and read its result stream, as another service would; needs --redis-url.

Besides Locust's own row for the HTTP request (time to response headers), each generation is
reported as request events, so they show in the UI, the CSV files and the HTML report:
  TTFT    time to first token (ms)
  ITL     each gap between two token chunks (ms)
  E2E     whole generation (ms); its "content size" is the number of completion tokens
  TPS     decode rate of the stream in tokens/s, reported in the response-time column
  CANCEL  a stream the client dropped on purpose (--cancel-share), time until it did (ms)
  JOB     (RedisJobUser) one job from XADD to its terminal event (ms)
Failures: HTTP errors, error events in the stream, a stream that ends without [DONE].
Row names say the path and the prompt kind, e.g. "chat [long]" and "redis [short]".

Workload options (flag or environment variable): --model (INFERQ_LOAD_MODEL; default: the first
of /v1/models), --api-key (INFERQ_API_KEY), --max-tokens, --prompt-mix short|long|mixed,
--long-prompt-words, --cancel-share, --redis-url (INFERQ_REDIS_URL), --redis-prefix.
Load shape: without INFERQ_LOAD_SHAPE, -u/-r/-t as usual; INFERQ_LOAD_SHAPE=steady|ramp|burst
picks a shape (llm_workload.shape_tick) sized by --shape-users, --shape-seconds, --shape-spawn-rate.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid

import llm_shapes
import llm_stream
import llm_workload
from locust import HttpUser, User, between, events, task
from locust.exception import StopUser


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    group = parser.add_argument_group("inferq workload")
    group.add_argument("--model", default="", env_var="INFERQ_LOAD_MODEL", help="model name (default: first served)")
    group.add_argument("--api-key", default="", env_var="INFERQ_API_KEY", help="Bearer key, if the API needs one")
    group.add_argument("--max-tokens", type=int, default=128, env_var="INFERQ_LOAD_MAX_TOKENS")
    group.add_argument("--prompt-mix", default="mixed", choices=["short", "long", "mixed"], env_var="INFERQ_LOAD_MIX")
    group.add_argument("--long-prompt-words", type=int, default=600, env_var="INFERQ_LOAD_LONG_WORDS")
    group.add_argument("--cancel-share", type=float, default=0.1, env_var="INFERQ_LOAD_CANCEL_SHARE",
                       help="share of streams the client drops after a few tokens")  # fmt: skip
    group.add_argument("--redis-url", default="redis://localhost:6379/0", env_var="INFERQ_REDIS_URL")
    group.add_argument("--redis-prefix", default="inferq", env_var="INFERQ_PREFIX")
    group.add_argument("--request-timeout", type=float, default=300.0, help="seconds before a generation fails")
    group.add_argument("--shape-users", type=int, default=16, help="peak users of INFERQ_LOAD_SHAPE")
    group.add_argument("--shape-seconds", type=float, default=120.0, help="length of INFERQ_LOAD_SHAPE")
    group.add_argument("--shape-spawn-rate", type=float, default=4.0, help="users started per second")


# NOTE: Locust runs with a shape class whenever the locustfile defines one, ignoring -u/-r/-t;
# so a shape exists only when asked for.
_SHAPE = os.environ.get("INFERQ_LOAD_SHAPE", "").strip().lower()
if _SHAPE:
    if _SHAPE not in llm_shapes.SHAPES:
        raise SystemExit(f"INFERQ_LOAD_SHAPE must be one of {sorted(llm_shapes.SHAPES)}, got {_SHAPE!r}")
    SelectedShape = llm_shapes.SHAPES[_SHAPE]


def _fire(environment, request_type: str, name: str, value: float, length: int = 0, error: str | None = None) -> None:
    environment.events.request.fire(
        request_type=request_type,
        name=name,
        response_time=value,
        response_length=length,
        exception=RuntimeError(error) if error else None,
        context={},
    )


def _report(environment, name: str, timer: llm_stream.StreamTimer, completion_tokens: int | None) -> None:
    """TTFT, each ITL, E2E and TPS of one finished generation."""
    if timer.ttft_ms is not None:
        _fire(environment, "TTFT", name, timer.ttft_ms)
    for gap in timer.gaps_ms:
        _fire(environment, "ITL", name, gap)
    tokens = completion_tokens if completion_tokens is not None else timer.num_tokens
    _fire(environment, "E2E", name, timer.elapsed_ms(), length=tokens)
    rate = timer.tokens_per_s(tokens)
    if rate is not None:
        _fire(environment, "TPS", name, rate)


class _Workload:
    """Per-user choices of prompt, length and cancellation (seeded per user, so runs are comparable)."""

    def __init__(self, options, seed: int) -> None:
        self.options = options
        self.rng = random.Random(seed)

    def next(self) -> tuple[str, str, int | None]:
        kind, prompt = llm_workload.pick_prompt(self.rng, self.options.prompt_mix, self.options.long_prompt_words)
        cancel_at = llm_workload.cancel_after(self.rng, self.options.cancel_share, self.options.max_tokens)
        return kind, prompt, cancel_at


_user_seeds = iter(range(1, 1 << 30))


class ChatStreamUser(HttpUser):
    """Streams chat completions over SSE and reports TTFT, ITL, E2E and TPS per generation."""

    weight = 3
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.workload = _Workload(options, next(_user_seeds))
        self.headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self.model = options.model or self._first_model()

    def _first_model(self) -> str:
        with self.client.get("/v1/models", headers=self.headers, name="/v1/models", catch_response=True) as resp:
            models = resp.json().get("data") if resp.ok else None
            if not models:
                resp.failure(f"no model to test: GET /v1/models answered {resp.status_code} {resp.text[:200]}")
                raise StopUser()
            return models[0]["id"]

    @task
    def stream_chat(self) -> None:
        options = self.environment.parsed_options
        kind, prompt, cancel_at = self.workload.next()
        name = f"chat [{kind}]"
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": options.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        timer = llm_stream.StreamTimer()
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=self.headers,
            stream=True,
            catch_response=True,
            name=name,
            timeout=options.request_timeout,
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"{resp.status_code}: {resp.text[:300]}")
                return
            usage, error, finished = None, None, False
            try:
                for data in llm_stream.sse_data(resp.iter_lines(delimiter=b"\n")):
                    if data == "[DONE]":
                        finished = True
                        break
                    text, chunk_usage, error = llm_stream.chunk_content(data)
                    if error:
                        break
                    usage = chunk_usage or usage
                    if text:
                        timer.token()
                        if cancel_at is not None and timer.num_tokens >= cancel_at:
                            break
            except Exception as exc:  # a dropped connection, a malformed chunk: this request failed
                error = f"stream broke after {timer.num_tokens} chunks: {type(exc).__name__}: {exc}"
            if error:
                resp.failure(error)
                return
            if cancel_at is not None and not finished:
                resp.success()
                resp.close()  # drop the connection: the API cancels the request after its resume grace
                _fire(self.environment, "CANCEL", name, timer.elapsed_ms(), length=timer.num_tokens)
                return
            if not finished:
                resp.failure(f"the stream ended without [DONE] after {timer.num_tokens} chunks")
                return
            resp.success()
        _report(self.environment, name, timer, (usage or {}).get("completion_tokens"))


class RedisJobUser(User):
    """Submits jobs straight into Redis per the wire contract and reads the result stream."""

    weight = 1
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        import redis  # NOTE: imported here so that ChatStreamUser alone runs without redis-py

        options = self.environment.parsed_options
        self.workload = _Workload(options, next(_user_seeds))
        self.client = redis.Redis.from_url(options.redis_url, decode_responses=True, socket_timeout=30)
        self.prefix = options.redis_prefix

    def on_stop(self) -> None:
        self.client.close()

    @task
    def submit_job(self) -> None:
        options = self.environment.parsed_options
        kind, prompt, cancel_at = self.workload.next()
        name = f"redis [{kind}]"
        request_id = f"locust-{uuid.uuid4().hex}"
        result_stream = f"{self.prefix}:result:{request_id}"
        # The raw XADD fields, exactly as any language would send them (README: "Through Redis").
        fields = {
            "v": "1",
            "id": request_id,
            "messages": json.dumps([{"role": "user", "content": prompt}]),
            "params": json.dumps({"max_tokens": options.max_tokens}),
            "created": repr(time.time()),
            "deadline": repr(time.time() + options.request_timeout),
        }
        timer = llm_stream.StreamTimer()
        try:
            self.client.xadd(f"{self.prefix}:requests", fields)
            error, finish_reason, completion_tokens = self._read(
                request_id, result_stream, timer, cancel_at, options.request_timeout
            )
        except Exception as exc:  # Redis unreachable or refusing, a malformed event
            error, finish_reason, completion_tokens = f"{type(exc).__name__}: {exc}", None, None
        # One JOB row per job (submit to terminal event): its failures are the Redis path's errors.
        _fire(self.environment, "JOB", name, timer.elapsed_ms(), length=timer.num_tokens, error=error)
        if error:
            return
        if finish_reason == "abort":  # we cancelled it (a natural finish that won the race is reported below)
            _fire(self.environment, "CANCEL", name, timer.elapsed_ms(), length=timer.num_tokens)
            return
        _report(self.environment, name, timer, completion_tokens)

    def _read(
        self, request_id: str, stream: str, timer: llm_stream.StreamTimer, cancel_at: int | None, timeout_s: float
    ) -> tuple[str | None, str | None, int | None]:
        """Follow the result stream to its terminal event: (error, finish_reason, completion_tokens)."""
        last_id = "0-0"
        cancelled = False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self.client.xread({stream: last_id}, block=1000, count=100)
            for _, entries in reply or []:
                for entry_id, event in entries:
                    last_id = entry_id
                    if event["type"] == "token":
                        timer.token(len(json.loads(event.get("token_ids") or "[]")))
                        if cancel_at is not None and not cancelled and timer.num_tokens >= cancel_at:
                            # The contract's cancel: the worker answers with a done event, finish_reason "abort".
                            self.client.set(f"{self.prefix}:cancel:{request_id}", "1", ex=3600)
                            cancelled = True
                    elif event["type"] == "done":
                        usage = json.loads(event.get("usage") or "{}")
                        return None, event.get("finish_reason"), usage.get("completion_tokens")
                    else:
                        return f"error event: {event.get('error')}", None, None
        return f"no terminal event within {timeout_s:g} s ({timer.num_tokens} tokens)", None, None
