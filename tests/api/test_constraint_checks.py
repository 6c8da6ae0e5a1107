"""What the API's constraint checks let through: every construct the grammar engine enforces, so that the
refusals (tests/api/test_api_structured_bad_input.py) never catch a good request."""

from __future__ import annotations

import pytest

from api.constraint_checks import check_json_schema, check_regex
from api.errors import FieldError
from tests.api.structured_schemas import SCHEMAS

GOOD_REGEXES = [
    r"^[a-z]+$", r"[(?=]x", r"\$[0-9]+\.[0-9]{2}", r"(a|b)*c?", r"[^\s]{1,4}", r"\d{3}-\d{4}", r"(?:ab)+",
    r"(?P<year>[0-9]{4})", r"a{2,}", r"[\w.-]+@[\w-]+\.com", r"", r"\^not an anchor\$",
]  # fmt: skip
BAD_REGEXES = [
    (r"a(?=b)", "lookahead"), (r"(?<=a)b", "lookahead/lookbehind"), (r"(?P<x>a)(?P=x)", "backreferences"),
    (r"(a)?(?(1)b|c)", "conditional"), (r"(?>ab)", "atomic"), (r"a++", "possessive"), (r"a^b", "anchors"),
    (r"\Aab", "anchors"), (r"(?s).", "flags"), (r"(?x) a", "flags"), ("(", "does not compile"),
]  # fmt: skip


@pytest.mark.parametrize("pattern", GOOD_REGEXES)
def test_regexes_the_grammar_engine_takes_pass(pattern):
    check_regex(pattern, "regex")


@pytest.mark.parametrize(("pattern", "says"), BAD_REGEXES, ids=[p for p, _ in BAD_REGEXES])
def test_regex_constructs_it_does_not_take_are_named(pattern, says):
    with pytest.raises(FieldError) as caught:
        check_regex(pattern, "structured_outputs.regex")
    assert caught.value.param == "structured_outputs.regex" and says in caught.value.message


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
def test_the_end_to_end_schemas_pass(schema):
    check_json_schema(schema, "schema")


@pytest.mark.parametrize(
    "schema",
    [{"oneOf": [{"type": "string"}, {"type": "integer"}]},
     {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False},
     {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "string"}]},
     {"type": "object", "properties": {"next": {"$ref": "#"}}},
     {"type": "array", "items": {"type": "string", "format": "date-time"}, "unevaluatedItems": False},
     {"title": "T", "description": "d", "examples": [1], "default": 1, "type": "integer", "deprecated": True}],
    ids=["oneOf", "patternProperties-alone", "draft-07-tuple", "self-ref", "formats", "annotations"],
)  # fmt: skip
def test_supported_keywords_pass(schema):
    check_json_schema(schema, "schema")
