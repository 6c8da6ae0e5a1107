"""Property-based fuzzing of chat and completion bodies through the real API and a real worker.

A `python -m worker` process serves the packaged SmolLM2-135M on CPU; the API runs in the test
process. Hypothesis draws bodies whose fields are in range, at an edge, just beyond one, of a
wrong type, unicode or a wrong nested shape (tests/api/body_fuzz.py), and for every one:
    - no 5xx;
    - a body that breaks a documented limit is a 400 naming one of the fields it breaks;
    - a valid body is accepted and completes (every choice ends with "stop" or "length");
and, all the while, a fixed greedy prompt streamed alongside completes with the text it has
when run alone. The float edges of every float field are checked one by one beforehand.

Bounded: a fixed number of examples, one to three tokens each (well under 90 s on 2 cores).
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from api.settings import ApiSettings
from tests.api.body_fuzz import bodies, expected_refusal, max_new_tokens, number_edges
from tests.api.processes import SERVED, WorkerProcess
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import chunks, parse_sse
from worker.protocol import Keys, ModelInfo

EXAMPLES = 40  # per kind of body
URLS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
GREEDY = {"model": SERVED, "messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0,
          "max_tokens": 12, "ignore_eos": True, "stream": True}  # fmt: skip


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    from engine.config import ModelConfig
    from engine.model_loader import resolve_model_dir

    resolve_model_dir(ModelConfig(model="default"))  # convert the GGUF once, before the worker wants it
    prefix = f"fzb{secrets.token_hex(4)}"
    client = redis_server.client(decode_responses=True)
    worker = WorkerProcess(redis_server, prefix, tmp_path_factory.mktemp("fuzz-bodies") / "worker.log")
    try:
        worker.wait_ready(client, prefix)
        info = ModelInfo.from_json(client.get(Keys(prefix).model))
        api = ThreadApi(ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY])).start()
        try:
            yield {"api": api, "vocab": info.vocab_size, "context": info.max_model_len}
        finally:
            api.stop()
    finally:
        worker.stop()
        client.close()


def post(http: httpx.Client, url: str, body: dict) -> httpx.Response:
    # ensure_ascii: a lone surrogate goes out as the JSON escape "\ud800", as a client's JSON would carry it
    raw = json.dumps(body, ensure_ascii=True, allow_nan=True)
    return http.post(url, content=raw, headers={"Content-Type": "application/json"})


def finish_reasons(response: httpx.Response, stream: bool) -> dict[int, str | None]:
    """Each choice's finish_reason, from the JSON answer or the SSE stream (which must end with [DONE])."""
    if not stream:
        return {c["index"]: c["finish_reason"] for c in response.json()["choices"]}
    events = parse_sse(response.text)
    assert events and events[-1]["data"] == "[DONE]", response.text[-500:]
    reasons: dict[int, str | None] = {}
    for chunk in chunks(events):
        for choice in chunk.get("choices", []):
            if choice.get("finish_reason"):
                reasons[choice["index"]] = choice["finish_reason"]
    return reasons


def check_answer(response: httpx.Response, body: dict, kind: str, vocab: int, context: int) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500], body)
    refused = expected_refusal(body, kind, vocab, context)
    if refused is not None:
        assert response.status_code == 400, (refused, response.status_code, response.text[:300], body)
        param = response.json()["error"]["param"] or ""
        assert param.split(".")[0].split("[")[0] in refused, (refused, response.json(), body)
        return
    assert response.status_code == 200, (response.status_code, response.text[:500], body)
    n = int(body.get("n", 1))
    reasons = finish_reasons(response, body.get("stream") is True)
    assert sorted(reasons) == list(range(n)) and set(reasons.values()) <= {"stop", "length"}, (reasons, body)
    if body.get("stream") is not True:
        usage = response.json()["usage"]
        assert 1 <= usage["completion_tokens"] <= n * max_new_tokens(body), (usage, body)


def greedy_text(http: httpx.Client) -> str:
    response = http.post(URLS["chat"], json=GREEDY)
    assert response.status_code == 200, response.text
    parts = chunks(parse_sse(response.text))
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in parts if c.get("choices"))


class Alongside:
    """Streams GREEDY again and again in a thread while the fuzz runs; every text must equal `alone`."""

    def __init__(self, api: ThreadApi, alone: str) -> None:
        self.api, self.alone = api, alone
        self.texts: list[str] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="greedy-alongside", daemon=True)

    def _run(self) -> None:
        try:
            with self.api.client(timeout=120) as http:
                while not self._stop.is_set():
                    self.texts.append(greedy_text(http))
        except BaseException as exc:  # reported by check()
            self.failure = exc

    def __enter__(self) -> Alongside:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def check(self) -> None:
        assert self.failure is None, repr(self.failure)
        assert self.texts and all(text == self.alone for text in self.texts), (self.alone, self.texts)


# (field, low, high, low is excluded): every float field of both bodies
FLOAT_FIELDS = [("temperature", 0.0, 2.0, False), ("top_p", 0.0, 1.0, True), ("min_p", 0.0, 1.0, False),
                ("presence_penalty", -2.0, 2.0, False), ("frequency_penalty", -2.0, 2.0, False),
                ("repetition_penalty", 0.01, 10.0, False), ("logit_bias", -100.0, 100.0, False)]  # fmt: skip
BOUNDS = {name: (lo, hi) for name, lo, hi, _ in FLOAT_FIELDS}


def test_float_fields_at_and_beyond_their_edges(stack):
    """Each float field at 0, 5e-324, 1e-300, -0.0, each bound and the float just beyond it, huge values,
    inf and nan: accepted and generating, or a 400 that names the field (and states the bound)."""
    cases = []
    for name, lo, hi, _ in FLOAT_FIELDS:
        for value in number_edges(lo, hi):
            if type(value) is int and abs(value) < 10**300:  # an int for a float: the fuzz covers it
                continue
            field = {name: {"42": value} if name == "logit_bias" else value}
            chat = {"model": SERVED, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], **field}
            completion = {"model": SERVED, "max_tokens": 1, "prompt": "Hi", **field}
            cases.append(("completion", name, value, completion))
            # The fields are common to both bodies: a chat body too, where the API must refuse it (a chat
            # prompt costs the worker ~30 tokens; a completion's "Hi" one).
            if expected_refusal(chat, "chat", stack["vocab"], stack["context"]) is not None:
                cases.append(("chat", name, value, chat))

    def run(case):
        kind, name, value, body = case
        with stack["api"].client(timeout=120) as http:
            return case, post(http, URLS[kind], body)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, cases))
    accepted = 0
    for (kind, name, value, body), response in results:
        check_answer(response, body, kind, stack["vocab"], stack["context"])
        if response.status_code == 400:
            error = response.json()["error"]
            assert error["param"].split(".")[0] == name, (name, value, error)
            if not (isinstance(value, float) and not math.isfinite(value)):  # inf, nan: "a finite number"
                assert any(f"{bound:g}" in error["message"] for bound in BOUNDS[name]), error
        else:
            accepted += 1
    assert 0 < accepted < len(results)


def test_fuzzed_bodies_get_the_answer_their_limits_say_and_leave_a_greedy_stream_alone(stack):
    api, vocab, context = stack["api"], stack["vocab"], stack["context"]
    with api.client(timeout=120) as http:
        alone = greedy_text(http)
    seen: dict[str, int] = {}

    def fuzz(kind: str, http: httpx.Client):
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                         HealthCheck.data_too_large])  # fmt: skip
        @given(body=bodies(kind, SERVED, vocab))
        def one_body(body):
            response = post(http, URLS[kind], body)
            check_answer(response, body, kind, vocab, context)
            verdict = "accepted" if response.status_code == 200 else "refused"
            seen[f"{kind} {verdict}"] = seen.get(f"{kind} {verdict}", 0) + 1

        one_body()

    with Alongside(api, alone) as alongside, api.client(timeout=120) as http:
        fuzz("chat", http)
        fuzz("completion", http)
    alongside.check()
    # Both outcomes were exercised for both kinds, and the stream ran beside the fuzz more than once.
    assert all(seen.get(f"{k} {v}", 0) >= 5 for k in URLS for v in ("accepted", "refused")), seen
    assert len(alongside.texts) >= 2, alongside.texts
