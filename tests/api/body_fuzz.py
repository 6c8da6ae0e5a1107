"""Request bodies for property-based fuzzing, and the answer the API owes each one.

`bodies(kind, vocab)` draws chat or completion bodies in which a few fields take a value that is
in range, at an edge, just beyond one, of a wrong type, unicode (lone surrogates included) or a
wrong nested shape; the rest stay valid. `expected_refusal(body, kind, vocab, context)` restates
the documented limits (the OpenAPI document's bounds and rules, api/limits.py's model limits),
written apart from api/schemas.py so that the two can disagree: it returns None for a body the API
must accept, else the fields one of which the 400 must name.

Valid bodies keep max_tokens at 1 to 3 and prompts short, so every accepted request is short work
for a real worker and prompt + max_tokens never approaches the context; the out-of-range
max_tokens drawn are at least the context (refused whatever the prompt).
"""

from __future__ import annotations

import math
import re
from typing import Any

from hypothesis import strategies as st

I31 = 2**31 - 1
I63 = 2**63 - 1
ABSENT = object()  # a drawn "value" that removes the field
SURROGATES = ["\ud800", "a\udfffb", "\udbff"]

# Values of the wrong type or shape for any field (the judge decides which are wrong where).
WRONG = [None, True, False, "1", "0.5", "", [], {}, [1], {"a": 1}, [[1]], {"x": [None]}, 1.5, -1, 0,
         10**30, *SURROGATES]  # fmt: skip


def _around(x: float) -> list[float]:
    return [math.nextafter(x, -math.inf), x, math.nextafter(x, math.inf)]


def number_edges(lo: float, hi: float) -> list[Any]:
    """The float edges of a range: each bound and its neighbours, zeros, the smallest floats, huge ones."""
    return [*_around(lo), *_around(hi), 0.0, -0.0, 5e-324, -5e-324, 1e-300, 1e-6, 1e308, -1e308, 10**400,
            -(10**400), math.inf, -math.inf, math.nan, int(lo), int(hi)]  # fmt: skip


def integer_edges(lo: int, hi: int) -> list[Any]:
    return [lo, hi, lo - 1, hi + 1, float(lo), 0, 1, 2**63, -(2**63), 2**64, 10**40, 2.5, 1e300, math.inf]


def numbers(lo: float, hi: float, *, exclude_lo: bool = False) -> st.SearchStrategy:
    inside = st.floats(lo, hi, exclude_min=exclude_lo)
    return st.one_of(inside, inside, st.sampled_from(number_edges(lo, hi)), st.sampled_from(WRONG))


def integers(lo: int, hi: int, *, valid: st.SearchStrategy | None = None) -> st.SearchStrategy:
    inside = valid if valid is not None else st.integers(lo, hi)
    return st.one_of(inside, inside, st.sampled_from(integer_edges(lo, hi)), st.sampled_from(WRONG))


def booleans() -> st.SearchStrategy:
    return st.one_of(st.booleans(), st.booleans(), st.sampled_from(WRONG))


text = st.text(st.characters(codec="utf-8"), max_size=12)  # any Unicode scalar value (no surrogates)


def strings(min_size: int = 0, max_size: int = 20) -> st.SearchStrategy:
    return st.one_of(
        st.text(st.characters(codec="utf-8"), min_size=min_size, max_size=max_size),
        st.sampled_from(["x" * 257, *SURROGATES, *WRONG]),
    )


def token_id_keys(vocab: int) -> st.SearchStrategy:
    ids = st.integers(0, vocab - 1)
    return st.one_of(
        ids.map(str),
        ids.map(lambda t: "00" + str(t)),  # leading zeros: the same token
        st.sampled_from([str(vocab), str(I31 + 1), "9" * 20, "0" * 21, "²", "①", "٣", "１", "+5", "-1", " 5", "5 ",
                         "1_0", "", "5\n", "0x10", "\ud800"]),
    )  # fmt: skip


def logit_biases(vocab: int) -> st.SearchStrategy:
    values = st.one_of(st.floats(-100, 100), st.sampled_from(number_edges(-100.0, 100.0) + ["1", True, None]))
    valid = st.dictionaries(st.integers(0, vocab - 1).map(str), st.floats(-100, 100), max_size=4)
    wild = st.dictionaries(token_id_keys(vocab), values, max_size=4)
    many = st.just({str(i): 1.0 for i in range(301)})
    return st.one_of(valid, valid, wild, many, st.sampled_from(WRONG))


def stops() -> st.SearchStrategy:
    one = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
    return st.one_of(one, st.lists(one, max_size=3), st.just(["s"] * 17), st.just("s" * 257), strings())


def token_lists(vocab: int, min_size: int = 0, max_size: int = 6) -> st.SearchStrategy:
    ids = st.one_of(st.integers(0, vocab - 1), st.integers(0, vocab - 1), st.sampled_from(
        [vocab, I31, I31 + 1, -1, 2**63, 3.0, 2.5, True, "1", None]))  # fmt: skip
    return st.one_of(st.lists(ids, min_size=min_size, max_size=max_size), st.sampled_from(WRONG))


def messages() -> st.SearchStrategy:
    roles = st.sampled_from(["system", "developer", "user", "assistant", "user", "tool", "robot", None, 1])
    part = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": text}),
        st.sampled_from([{"type": "image_url"}, {"type": "text"}, {"type": "text", "text": 5}, "part", None]),
    )
    content = st.one_of(text, text, st.lists(part, max_size=2), st.sampled_from([None, 5, {"text": "x"}, "\ud800"]))
    message = st.fixed_dictionaries(
        {"role": roles, "content": content},
        optional={"name": strings(max_size=8), "tool_calls": st.sampled_from([None, [], [{"id": "1"}], 0, {}])},
    )
    wrong_message = st.sampled_from(["hi", None, 1, [], {"content": "x"}, {"role": "user"}])
    return st.one_of(
        st.lists(message, min_size=1, max_size=3), st.lists(message, min_size=1, max_size=3),
        st.lists(st.one_of(message, wrong_message), max_size=3), st.sampled_from(WRONG),
    )  # fmt: skip


def prompts(vocab: int) -> st.SearchStrategy:
    one_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
    ids = token_lists(vocab, min_size=1, max_size=10)
    return st.one_of(
        one_text, one_text, ids, st.lists(one_text, min_size=1, max_size=2), st.lists(ids, min_size=1, max_size=2),
        st.sampled_from(["", [], [[]], ["a", 1], *SURROGATES, *WRONG]),
    )  # fmt: skip


def _short_or_refused(v: Any) -> bool:
    """No max_tokens that is valid and long: not null (the default is the rest of the context), not 4 to 511."""
    return v is not None and not (_is_int(v) and 3 < int(v) < 512)


def field_values(kind: str, vocab: int) -> dict[str, st.SearchStrategy]:
    fields = {
        "model": st.sampled_from([ABSENT, None, 5, "", "m" * 257, "\ud800"]),
        "max_tokens": integers(1, 3).filter(_short_or_refused),
        "temperature": numbers(0.0, 2.0),
        "top_p": numbers(0.0, 1.0, exclude_lo=True),
        "top_k": integers(-1, I31),
        "min_p": numbers(0.0, 1.0),
        "n": integers(1, 16),
        "stop": stops(),
        "stop_token_ids": token_lists(vocab, max_size=3),
        "seed": integers(0, I63),
        "presence_penalty": numbers(-2.0, 2.0),
        "frequency_penalty": numbers(-2.0, 2.0),
        "repetition_penalty": numbers(0.01, 10.0),
        "logit_bias": logit_biases(vocab),
        "user": strings(max_size=10),
        "ignore_eos": booleans(),
        "min_tokens": integers(0, 3),
        "skip_special_tokens": booleans(),
        "priority": integers(-I31, I31),
        "stream": booleans(),
        "stream_options": st.one_of(
            st.fixed_dictionaries({}, optional={"include_usage": booleans()}), st.sampled_from(WRONG)
        ),
        "tools": st.sampled_from([[], None, [{"type": "function", "function": {"name": "f"}}], "x"]),
        "response_format": st.sampled_from([{"type": "text"}, None, {"type": "json_object"}, "text"]),
        "\ud800x": st.just(1),
        "unknown_field": st.sampled_from([1, "x", {"nested": [1, {"a": None}]}, [math.inf]]),
    }
    if kind == "chat":
        fields |= {
            "messages": messages(),
            "max_completion_tokens": integers(1, 3).filter(lambda v: v is None or _short_or_refused(v)),
            "logprobs": booleans(),
            "top_logprobs": integers(0, 20),
        }
    else:
        fields |= {
            "prompt": prompts(vocab),
            "logprobs": integers(0, 20),
            "echo": st.sampled_from([False, None, True, 0]),
            "best_of": integers(1, 16),
            "suffix": st.sampled_from(["", None, "x"]),
        }
    return fields


@st.composite
def bodies(draw: st.DrawFn, kind: str, model: str, vocab: int) -> dict[str, Any]:
    """A valid body of `kind` with 1 to 4 of its fields drawn from their wild strategies."""
    body: dict[str, Any] = {"model": model, "max_tokens": draw(st.integers(1, 3))}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": draw(text)}]
    else:
        body["prompt"] = draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=20))
    values = field_values(kind, vocab)
    for name in draw(st.lists(st.sampled_from(sorted(values)), min_size=1, max_size=4, unique=True)):
        value = draw(values[name])
        if value is ABSENT:
            body.pop(name, None)
        else:
            body[name] = value
    return body


# --- The judge: the documented limits, restated -----------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return type(v) is int or (type(v) is float and v.is_integer())


def _int_in(v: Any, lo: int | None, hi: int | None = None) -> bool:
    return _is_int(v) and (lo is None or int(v) >= lo) and (hi is None or int(v) <= hi)


def _num_in(v: Any, lo: float, hi: float, *, exclude_lo: bool = False) -> bool:
    if type(v) not in (int, float) or (type(v) is float and not math.isfinite(v)):
        return False
    return (v > lo if exclude_lo else v >= lo) and v <= hi  # exact: Python compares int and float exactly


def _str_in(v: Any, lo: int, hi: int | None) -> bool:
    return type(v) is str and lo <= len(v) and (hi is None or len(v) <= hi)


def _has_surrogate(v: Any) -> bool:
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, dict):
        return any(_has_surrogate(k) or _has_surrogate(x) for k, x in v.items())
    if isinstance(v, list):
        return any(map(_has_surrogate, v))
    return False


def _same(v: Any, choices: list[Any]) -> bool:
    return any(type(v) is type(c) and v == c for c in choices)


def _stop_ok(v: Any) -> bool:
    if v is None or _str_in(v, 1, 256):
        return True
    return type(v) is list and len(v) <= 16 and all(_str_in(s, 1, 256) for s in v)


def _token_list_ok(v: Any, min_size: int, max_size: int | None = None) -> bool:
    return (
        type(v) is list and min_size <= len(v) and (max_size is None or len(v) <= max_size)
        and all(_int_in(t, 0, I31) for t in v)
    )  # fmt: skip


def _logit_bias_ok(v: Any) -> bool:
    if v is None:
        return True
    return (
        type(v) is dict and len(v) <= 300 and all(re.fullmatch(r"[0-9]{1,20}", k) for k in v)
        and all(_num_in(x, -100.0, 100.0) for x in v.values())
    )  # fmt: skip


def _message_ok(m: Any) -> bool:
    if type(m) is not dict or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        return False
    if "tool_calls" in m and not _same(m["tool_calls"], [None, []]):
        return False
    if "name" in m and not (m["name"] is None or _str_in(m["name"], 0, 256)):
        return False
    content = m.get("content")
    if type(content) is str:
        return True
    return (
        type(content) is list and len(content) >= 1
        and all(type(p) is dict and p.get("type") == "text" and type(p.get("text")) is str for p in content)
    )  # fmt: skip


def _tool_ok(tool: Any) -> bool:
    function = tool.get("function") if type(tool) is dict else None
    return tool.get("type") == "function" and type(function) is dict and type(function.get("name")) is str


def _prompt_ok(v: Any) -> bool:
    if _str_in(v, 1, None) or _token_list_ok(v, 1):
        return True
    return type(v) is list and len(v) == 1 and (_str_in(v[0], 1, None) or _token_list_ok(v[0], 1))


def _field_errors(body: dict[str, Any], kind: str) -> set[str]:
    """Fields whose value breaks its own type or range (the OpenAPI document's per-field schema)."""
    checks: dict[str, Any] = {
        "model": lambda v: _str_in(v, 1, 256),
        "max_tokens": lambda v: v is None or _int_in(v, 1),
        "temperature": lambda v: v is None or _num_in(v, 0.0, 2.0),
        "top_p": lambda v: v is None or _num_in(v, 0.0, 1.0, exclude_lo=True),
        "top_k": lambda v: v is None or _int_in(v, -1, I31),
        "min_p": lambda v: v is None or _num_in(v, 0.0, 1.0),
        "n": lambda v: _int_in(v, 1, 16),
        "stop": _stop_ok,
        "stop_token_ids": lambda v: v is None or _token_list_ok(v, 0, 64),
        "seed": lambda v: v is None or _int_in(v, 0, I63),
        "presence_penalty": lambda v: v is None or _num_in(v, -2.0, 2.0),
        "frequency_penalty": lambda v: v is None or _num_in(v, -2.0, 2.0),
        "repetition_penalty": lambda v: v is None or _num_in(v, 0.01, 10.0),
        "logit_bias": _logit_bias_ok,
        "user": lambda v: v is None or _str_in(v, 0, 256),
        "ignore_eos": lambda v: type(v) is bool,
        "min_tokens": lambda v: _int_in(v, 0),
        "skip_special_tokens": lambda v: type(v) is bool,
        "priority": lambda v: _int_in(v, -I31, I31),
        "stream": lambda v: type(v) is bool,
        "stream_options": lambda v: v is None or (type(v) is dict and type(v.get("include_usage", False)) is bool),
        "response_format": lambda v: v is None or (type(v) is dict and v.get("type") in ("text", "json_object")),
    }
    if kind == "chat":
        checks |= {
            "messages": lambda v: type(v) is list and 1 <= len(v) <= 1024 and all(map(_message_ok, v)),
            "max_completion_tokens": lambda v: v is None or _int_in(v, 1),
            "logprobs": lambda v: type(v) is bool,
            "top_logprobs": lambda v: v is None or _int_in(v, 0, 20),
            "tools": lambda v: v is None or (type(v) is list and all(map(_tool_ok, v))),
        }
    else:
        checks |= {
            "prompt": _prompt_ok,
            "logprobs": lambda v: v is None or _int_in(v, 0, 20),
            "best_of": lambda v: v is None or _int_in(v, 1, 16),
        }
    required = {"model", "messages"} if kind == "chat" else {"model", "prompt"}
    bad = {name for name in required if name not in body}
    return bad | {name for name, ok in checks.items() if name in body and not ok(body[name])}


def expected_refusal(body: dict[str, Any], kind: str, vocab: int, context: int) -> set[str] | None:
    """None if the API must accept `body`; else the fields (top-level names) one of which the 400 names.

    The API checks in four steps and answers the first that fails; within a step any of its fields."""
    # 1. the raw object: broken Unicode anywhere, unsupported features, several prompts
    step = {k.encode("utf-8", "backslashreplace").decode() for k, v in body.items() if _has_surrogate(k) or
            _has_surrogate(v)}  # fmt: skip
    if kind == "completion":
        for name, neutral in (("echo", [None, False]), ("suffix", [None, ""]), ("tools", [None, []])):
            if name in body and not _same(body[name], neutral):
                step.add(name)
        prompt = body.get("prompt")
        if type(prompt) is list and len(prompt) > 1 and all(type(p) in (str, list) for p in prompt):
            step.add("prompt")
    if step:
        return step
    # 2. each field's type and range
    if step := _field_errors(body, kind):
        return step
    # 3. rules between fields
    if body.get("stream_options") is not None and body.get("stream") is not True:
        step.add("stream_options")
    if kind == "chat" and body.get("top_logprobs") is not None and body.get("logprobs") is not True:
        step.add("top_logprobs")
    if kind == "completion" and body.get("best_of") is not None and int(body["best_of"]) != int(body.get("n", 1)):
        step.add("best_of")
    if step:
        return step
    # 4. the served model's limits (short prompts: only max_tokens can reach the context)
    prompt = body.get("prompt")
    if kind == "completion" and type(prompt) is list:
        ids = prompt[0] if type(prompt[0]) is list else prompt
        if any(int(t) >= vocab for t in ids):
            step.add("prompt")
    if any(int(k) >= vocab for k in body.get("logit_bias") or {}):
        step.add("logit_bias")
    if any(int(t) >= vocab for t in body.get("stop_token_ids") or []):
        step.add("stop_token_ids")
    name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    requested = body.get(name)
    if requested is not None and int(requested) >= context:
        step.add(name)
    elif requested is not None and int(body.get("min_tokens", 0)) > int(requested):
        step.add("min_tokens")
    return step or None


def max_new_tokens(body: dict[str, Any]) -> int:
    """The max_tokens of an accepted body (chat: max_completion_tokens wins)."""
    chosen = body.get("max_completion_tokens")
    return int(chosen if chosen is not None else body["max_tokens"])
