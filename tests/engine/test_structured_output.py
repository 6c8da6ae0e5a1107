"""Structured output through the engine with the packaged SmolLM2 (real weights, real tokenizer, real
xgrammar): constrained greedy and seeded output matches its regex, validates against its schema, is one of its
choices; constrained and free requests share batches; n > 1, stop strings and logprobs keep working; a
repeated constraint is a cache hit; a constraint that fails to compile or runs out of time fails only its own
request, before any token; a resumed request continues its constraint exactly."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest

from engine.sampling_params import SamplingParams
from engine.structured_output.grammar_state import GrammarState
from tests.engine.engine_helpers import make_engine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    engine = make_engine(smollm2_dir, max_model_len=512, num_kv_tokens=4096)
    yield engine
    engine.constrained.shutdown()


def _prompt(engine, text: str) -> list[int]:
    return engine.apply_chat_template([{"role": "user", "content": text}])


def run(engine, requests: dict[str, tuple[list[int], SamplingParams]], priors: dict | None = None) -> dict:
    """request id -> {index: (token ids, text, finish reason, error)} once every request finished."""
    results: dict[str, dict[int, list]] = {}
    for request_id, (prompt, params) in requests.items():
        prior = (priors or {}).get(request_id)
        engine.add_request(request_id, prompt, params, prior_output_token_ids=prior)
    deadline = time.monotonic() + 120
    while engine.has_unfinished_requests():
        assert time.monotonic() < deadline
        for out in engine.step():
            entry = results.setdefault(out.request_id, {}).setdefault(out.index, [[], "", None, None])
            entry[0] += out.new_token_ids
            entry[1] += out.new_text
            if out.finished:
                entry[2], entry[3] = out.finish_reason, out.error
    return results


def test_schema_regex_choice_and_free_requests_share_batches(engine):
    params = dict(max_tokens=80, temperature=0.0)
    requests = {
        "schema": (_prompt(engine, "Describe a person as JSON."),
                   SamplingParams(**params, structured_output={"json": SCHEMA})),
        "seeded": (_prompt(engine, "A person as JSON, please."),
                   SamplingParams(max_tokens=80, temperature=0.9, seed=7, structured_output={"json": SCHEMA})),
        "object": (_prompt(engine, "Any JSON object."),
                   SamplingParams(**params, structured_output={"json_object": True})),
        "regex": (_prompt(engine, "Give a date."),
                  SamplingParams(**params, structured_output={"regex": r"(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]"})),
        "choice": (_prompt(engine, "Is the sky blue?"),
                   SamplingParams(**params, structured_output={"choice": ["yes!", "no way"]})),
        "free": (_prompt(engine, "Say hello."), SamplingParams(**params)),
    }  # fmt: skip
    out = run(engine, requests)
    for key in ("schema", "seeded"):
        tokens, text, reason, error = out[key][0]
        assert reason == "stop" and error is None, (key, text, reason, error)
        jsonschema.validate(json.loads(text), SCHEMA)
    tokens, text, reason, _ = out["object"][0]
    if reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # greedy SmolLM2 nests objects past max_tokens: every token must still be one the grammar takes
        key = ("json_object", "true")
        state = GrammarState(engine.constrained.service().compile_now(key))
        assert reason == "length" and text.startswith("{") and all(state.accept(t) for t in tokens)
    assert re.fullmatch(r"(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]", out["regex"][0][1]), out["regex"][0][1]
    assert out["regex"][0][2] == "stop"  # ended by the grammar, without waiting for EOS
    assert out["choice"][0][1] in ("yes!", "no way") and out["choice"][0][2] == "stop"
    alone = run(engine, {"free2": requests["free"]})  # the free request's output is its own, batch or not
    assert alone["free2"][0][0] == out["free"][0][0]


def test_n_stop_strings_logprobs_and_the_cache(engine):
    service = engine.constrained.service()
    regex = {"regex": r"[a-z]{3,8}( [a-z]{3,8}){2,5}\."}
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=60, logprobs=2, structured_output=regex)
    out = run(engine, {"n": (_prompt(engine, "Write words."), params)})
    texts = [out["n"][i][1] for i in range(3)]
    for text in texts:
        assert re.fullmatch(r"[a-z]{3,8}( [a-z]{3,8}){2,5}\.", text), text
    hits = service.num_hits
    stopped = SamplingParams(temperature=0.0, max_tokens=60, stop=[" "], structured_output=regex)
    out = run(engine, {"stop": (_prompt(engine, "Write words."), stopped)})
    tokens, text, reason, _ = out["stop"][0]
    assert reason == "stop" and " " not in text and re.fullmatch(r"[a-z]{3,8}", text), text
    assert service.num_hits == hits + 1  # the same regex: compiled once


def test_bad_constraints_fail_only_their_request_before_any_token(engine):
    prompt = _prompt(engine, "Hi")
    requests = {
        "bad-grammar": (prompt, SamplingParams(max_tokens=8, structured_output={"grammar": "root ::= undefined_rule"})),
        "bad-regex": (prompt, SamplingParams(max_tokens=8, structured_output={"regex": "[a-"})),
        "bad-schema": (prompt, SamplingParams(max_tokens=8, structured_output={"json": {"type": "nonsense"}})),
        "good": (prompt, SamplingParams(max_tokens=8, temperature=0.0, structured_output={"choice": ["ok"]})),
    }
    out = run(engine, requests)
    for key, field in (("bad-grammar", "grammar"), ("bad-regex", "regex"), ("bad-schema", "json")):
        tokens, _, reason, error = out[key][0]
        assert reason == "error" and tokens == [] and error.startswith(f"structured_output.{field}: "), error
    assert out["good"][0][1] == "ok" and out["good"][0][2] == "stop"


def test_a_compile_past_the_time_limit_fails_its_request_alone(engine, monkeypatch):
    service = engine.constrained.service()
    compile_grammar = service._compile

    def slow_compile(kind: str, text: str):  # a compile that outlasts the limit (real ones on big schemas do)
        time.sleep(0.5)
        return compile_grammar(kind, text)

    monkeypatch.setattr(service, "_compile", slow_compile)
    monkeypatch.setattr(service, "timeout_s", 0.1)
    schema = {"type": "object", "properties": {"slow": {"type": "integer"}}}
    prompt = _prompt(engine, "Hi")
    out = run(engine, {
        "slow": (prompt, SamplingParams(max_tokens=8, structured_output={"json": schema})),
        "free": (prompt, SamplingParams(max_tokens=4, temperature=0.0)),
    })  # fmt: skip
    tokens, _, reason, error = out["slow"][0]
    assert reason == "error" and tokens == [] and "did not compile within 0.1 s" in error, error
    assert out["free"][0][2] == "length" and len(out["free"][0][0]) == 4
    assert error.startswith("structured_output.json: ")


def test_a_resumed_request_continues_its_constraint_exactly(engine):
    prompt = _prompt(engine, "A person as JSON.")
    params = SamplingParams(max_tokens=80, temperature=0.8, seed=3, structured_output={"json": SCHEMA})
    whole = run(engine, {"whole": (prompt, params)})["whole"][0]
    cut = len(whole[0]) // 2
    resumed = run(engine, {"resumed": (prompt, params)}, priors={"resumed": whole[0][:cut]})["resumed"][0]
    assert whole[0][:cut] + resumed[0] == whole[0]
    jsonschema.validate(json.loads(whole[1]), SCHEMA)


def test_structured_output_is_checked_naming_the_field():
    for value, match in (
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"json": "[1]"}, r"structured_output\.json must be a JSON Schema object"),
        ({"json_object": 1}, r"structured_output\.json_object must be true"),
        ({"choice": []}, r"structured_output\.choice must be a list of 1 to 256"),
        ({"choice": ["x" * 1025]}, r"structured_output\.choice\[0\]"),
        ({"grammar": " "}, r"structured_output\.grammar must be a non-empty string"),
        ({"regex": "a" * 70_000}, r"structured_output\.regex may be at most 65536"),
    ):
        with pytest.raises(ValueError, match=match):
            SamplingParams(structured_output=value)


def test_async_scheduling_gives_the_same_constrained_tokens(engine, monkeypatch):
    """Under async scheduling the runner hands each constrained request's pending token to its grammar once the
    next forward is queued; the tokens equal the synchronous run's, token for token."""
    requests = {
        "schema": (_prompt(engine, "A person as JSON."),
                   SamplingParams(max_tokens=60, temperature=0.8, seed=5, structured_output={"json": SCHEMA})),
        "regex": (_prompt(engine, "Give a date."),
                  SamplingParams(max_tokens=20, temperature=0.0, structured_output={"regex": r"20[0-9]{2}-[01][0-9]"})),
        "free": (_prompt(engine, "Say hello."), SamplingParams(max_tokens=12, temperature=0.0)),
    }  # fmt: skip
    synchronous = run(engine, requests)
    taken_ahead = []
    accept_ahead = GrammarState.accept_ahead
    monkeypatch.setattr(
        GrammarState, "accept_ahead", lambda self, token: taken_ahead.append(token) or accept_ahead(self, token)
    )
    engine.async_scheduling = True
    try:
        overlapped = run(engine, {f"{rid}-async": value for rid, value in requests.items()})
        assert not engine.live.sync_ids
    finally:
        engine.async_scheduling = False
    for request_id in requests:
        assert overlapped[f"{request_id}-async"] == synchronous[request_id], request_id
    assert len(taken_ahead) > 20  # the grammars took their pending tokens while the next step was queued
    jsonschema.validate(json.loads(synchronous["schema"][0][1]), SCHEMA)


@pytest.fixture(scope="module")
def choice_state(engine):
    return lambda: GrammarState(engine.constrained.service().compile_now(("choice", json.dumps(["ab", "ac"]))))


def test_drop_ahead_undoes_the_token_taken_ahead(engine, choice_state):
    state = choice_state()
    first = engine.tokenizer.encode("a", add_special_tokens=False)
    assert len(first) == 1
    state.accept_ahead(first[0])
    state.drop_ahead()
    assert state.ends_after(first[0]) is False  # taken again from the start: the grammar is where it was


def test_logprobs_stay_raw_and_penalties_still_apply(engine):
    prompt = _prompt(engine, "Is the sky blue?")
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=5, structured_output={"choice": ["yes!", "no way"]})
    engine.add_request("lp", prompt, params)
    logprobs = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            logprobs += out.new_logprobs or []
    allowed = {engine.tokenizer.encode(text, add_special_tokens=False)[0] for text in ("yes!", "no way")}
    first = logprobs[0]
    assert first.token_id in allowed and len(first.top) == 5
    assert set(first.top) - allowed  # the alternatives are the model's own, tokens the grammar forbids included
    penalized = SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5,
                               structured_output={"regex": r"[a-z]{3,8}( [a-z]{3,8}){2,5}\."})  # fmt: skip
    text = run(engine, {"pen": (_prompt(engine, "Write words."), penalized)})["pen"][0][1]
    assert re.fullmatch(r"[a-z]{3,8}( [a-z]{3,8}){2,5}\.", text), text


def test_constrained_requests_beside_speculating_ones_keep_their_tokens(engine, smollm2_dir):
    """With n-gram speculation on, a constrained request does not speculate (its proposals would need the
    grammar's mask at every proposed position) while a free one beside it does: both give the tokens of an
    engine without speculation, and the JSON still validates."""
    from tests.engine.spec_helpers import spec_config

    copy = "Repeat exactly: the queue holds the request, the worker holds the queue, the queue holds the request."
    requests = {
        "json": (_prompt(engine, "Describe a person as JSON."),
                 SamplingParams(temperature=0.0, max_tokens=60, structured_output={"json": SCHEMA})),
        "free": (_prompt(engine, copy), SamplingParams(temperature=0.0, max_tokens=30)),
    }  # fmt: skip
    speculating = make_engine(smollm2_dir, max_model_len=512, num_kv_tokens=4096, speculative=spec_config(4))
    try:
        got = run(speculating, requests)
    finally:
        speculating.constrained.shutdown()
    assert got == run(engine, requests)
    assert got["json"][0][2] == "stop" and got["json"][0][3] is None
    jsonschema.validate(json.loads(got["json"][0][1]), SCHEMA)
    assert speculating.speculator.stats.num_drafts > 0  # the free request did speculate
