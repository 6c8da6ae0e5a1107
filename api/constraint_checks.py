"""What the API can tell about a constraint without the grammar engine: is the JSON Schema well formed and
within what the worker's grammar engine (xgrammar) enforces, does the regex compile and use only what
it enforces.

The worker compiles every constraint (xgrammar imports torch; the API may not); these checks answer the
common mistakes with a 400 naming the field before anything is enqueued. A constraint that passes here and
still fails to compile ends the request with an error event before any token (api/constraint_errors.py).

Refused rather than ignored: a keyword xgrammar leaves unenforced would give output that fails the
schema the client validates against, which is worse than a 400 that says which keyword to drop
(docs/decisions/0059-structured-output-api.md lists them).
"""

from __future__ import annotations

import re
from re import _constants as _sre  # type: ignore[attr-defined]
from re import _parser as _sre_parser  # type: ignore[attr-defined]
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from api.errors import FieldError

# Keywords the grammar engine does not enforce: output under them may fail the schema.
UNSUPPORTED_KEYWORDS = frozenset({
    "if", "then", "else", "not", "dependentSchemas", "dependentRequired", "dependencies", "contains",
    "minContains", "maxContains", "uniqueItems", "multipleOf", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
})  # fmt: skip
SUPPORTED_FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "ipv4", "ipv6", "hostname", "uuid", "uri", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer",
})  # fmt: skip
# Keywords whose value is one subschema, a list of them, or a map of name -> subschema.
_ONE_SCHEMA = ("additionalProperties", "items", "unevaluatedProperties", "unevaluatedItems", "propertyNames")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# Regex flags the grammar engine has no notion of (inline `(?i)`, `(?s)`, `(?m)`, `(?x)`).
_FLAGS = {re.IGNORECASE: "i", re.MULTILINE: "m", re.DOTALL: "s", re.VERBOSE: "x"}
_REFUSED_OPS = {
    _sre.ASSERT: "lookahead/lookbehind assertions",
    _sre.ASSERT_NOT: "negative lookahead/lookbehind assertions",
    _sre.GROUPREF: "backreferences",
    _sre.GROUPREF_EXISTS: "conditional groups",
    _sre.ATOMIC_GROUP: "atomic groups",
    _sre.POSSESSIVE_REPEAT: "possessive quantifiers",
}


def check_regex(pattern: str, field: str) -> None:
    """Compile `pattern` with Python's `re` and refuse what the grammar engine's regex does not have.

    NOTE: the parse tree comes from `re._parser`, the parser `re.compile` itself runs: a regex is refused
    for what it holds, never for a text that merely looks like a lookahead inside a character class.
    """
    try:
        parsed = _sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise FieldError(field, f"the regex does not compile: {exc}") from None
    flags = [name for flag, name in _FLAGS.items() if parsed.state.flags & flag]
    if flags:
        raise FieldError(field, f"inline regex flags ({', '.join(flags)}) are not supported")
    _check_ops(parsed, field, top=True)


def _check_ops(parsed: Any, field: str, *, top: bool) -> None:
    items = list(parsed)
    for position, (op, argument) in enumerate(items):
        if op in _REFUSED_OPS:
            raise FieldError(field, f"{_REFUSED_OPS[op]} are not supported in this regex")
        if op is _sre.AT:
            at_edge = top and (
                (argument is _sre.AT_BEGINNING and position == 0)
                or (argument is _sre.AT_END and position == len(items) - 1)
            )
            if not at_edge:
                raise FieldError(field, "anchors other than a leading ^ and a trailing $ (\\b, \\B, \\A, \\Z, or "
                                 "^/$ mid-pattern) are not supported in this regex")  # fmt: skip
        for sub in _subpatterns(op, argument):
            _check_ops(sub, field, top=False)


def _subpatterns(op: Any, argument: Any) -> list[Any]:
    if op is _sre.SUBPATTERN:
        return [argument[-1]]
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
        return [argument[-1]]
    if op is _sre.BRANCH:
        return list(argument[1])
    return []


def check_json_schema(schema: Any, field: str) -> None:
    """A JSON object that is a valid JSON Schema (its meta-schema; draft 2020-12 unless `$schema` names
    another) and uses only what the grammar engine enforces."""
    if not isinstance(schema, dict):
        raise FieldError(field, f"must be a JSON Schema object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise FieldError(field + where, f"is not a valid JSON Schema: {exc.message}") from None
    _check_keywords(schema, field)


def _check_keywords(schema: Any, path: str) -> None:
    if not isinstance(schema, dict):
        return  # true/false, checked by the meta-schema
    for keyword in schema:
        if keyword in UNSUPPORTED_KEYWORDS:
            raise FieldError(f"{path}.{keyword}", f"the JSON Schema keyword '{keyword}' is not supported")
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        raise FieldError(f"{path}.$ref", f"only references inside the schema ('#/...') are supported, got {ref!r}")
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        raise FieldError(f"{path}.allOf", f"allOf with more than one schema is not supported (got {len(all_of)})")
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
        raise FieldError(f"{path}.format", f"the string format {fmt!r} is not supported; supported: "
                         f"{', '.join(sorted(SUPPORTED_FORMATS))}")  # fmt: skip
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        check_regex(pattern, f"{path}.pattern")
    for keyword in ("patternProperties", "propertyNames"):
        if keyword in schema and (
            "properties" in schema or "required" in schema or schema.get("additionalProperties") is not False
        ):
            raise FieldError(
                f"{path}.{keyword}",
                f"'{keyword}' is supported only with additionalProperties false and no properties or required",
            )
    for name in schema.get("patternProperties") or {}:
        check_regex(name, f"{path}.patternProperties")
    _check_children(schema, path)


def _check_children(schema: dict[str, Any], path: str) -> None:
    for keyword in _ONE_SCHEMA:
        child = schema.get(keyword)
        if isinstance(child, dict):
            _check_keywords(child, f"{path}.{keyword}")
        elif keyword == "items" and isinstance(child, list):  # draft 4-7 tuple form
            for i, item in enumerate(child):
                _check_keywords(item, f"{path}.items[{i}]")
    for keyword in _SCHEMA_LISTS:
        children = schema.get(keyword)
        if isinstance(children, list):
            for i, child in enumerate(children):
                _check_keywords(child, f"{path}.{keyword}[{i}]")
    for keyword in _SCHEMA_MAPS:
        children = schema.get(keyword)
        if isinstance(children, dict):
            for name, child in children.items():
                _check_keywords(child, f"{path}.{keyword}.{name}")
