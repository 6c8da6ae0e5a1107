"""Structured output requests: OpenAI's `response_format`, vLLM's `structured_outputs` and its older
`guided_*` fields, turned into the one constraint the Redis message's `params.structured_output` carries:

    {"json": <schema>} | {"json_object": true} | {"regex": str} | {"choice": [str, ...]} | {"grammar": str}

Shapes (types, list and string lengths) are declared here and published in the OpenAPI document. What
the document cannot state (is a schema a valid JSON Schema the grammar engine enforces, does a regex
compile) is checked by `constraint_of` before anything is enqueued, answered 400 with code
`invalid_constraint` and the field named (api/constraint_checks.py).
At most one source of a constraint per request: two (response_format json_schema and guided_regex, or a
constraint and a `required`/named tool_choice, which sends its own) is a 400 naming the second.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from api.constraint_checks import check_json_schema, check_regex
from api.errors import bad_request
from api.field_types import MAX_CHOICE_CHARS, MAX_CHOICES, MAX_STRUCTURED_OUTPUT_CHARS

INVALID_CONSTRAINT = "invalid_constraint"

ChoiceText = Annotated[StrictStr, Field(min_length=1, max_length=MAX_CHOICE_CHARS)]
ChoiceList = Annotated[
    list[ChoiceText],
    Field(min_length=1, max_length=MAX_CHOICES, description=f"1 to {MAX_CHOICES} strings of 1 to {MAX_CHOICE_CHARS}."),
]
ConstraintText = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STRUCTURED_OUTPUT_CHARS)]
# A schema given as an object, or as its JSON text (vLLM accepts both).
SchemaValue = dict[str, Any] | ConstraintText


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[StrictStr, Field(min_length=1, max_length=256)] = "response"
    description: StrictStr | None = None
    # NOTE: `schema` shadows a BaseModel attribute; the alias keeps OpenAI's field name.
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="A JSON Schema (draft 2020-12).")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, description='Required when type is "json_schema".')


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of these."""

    model_config = ConfigDict(extra="ignore")
    json_: SchemaValue | None = Field(None, alias="json")  # type: ignore[valid-type]
    json_object: StrictBool | None = None
    regex: ConstraintText | None = None  # type: ignore[valid-type]
    choice: ChoiceList | None = None  # type: ignore[valid-type]
    grammar: ConstraintText | None = None  # type: ignore[valid-type]


class ConstraintFields(BaseModel):
    """The request fields that ask for structured output (chat and completions)."""

    model_config = ConfigDict(extra="ignore")
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: SchemaValue | None = None  # type: ignore[valid-type]
    guided_regex: ConstraintText | None = None  # type: ignore[valid-type]
    guided_choice: ChoiceList | None = None  # type: ignore[valid-type]
    guided_grammar: ConstraintText | None = None  # type: ignore[valid-type]

    def requested_constraints(self) -> list[tuple[str, dict[str, Any]]]:
        """(field, constraint) of every field that asks for one, unchecked."""
        found: list[tuple[str, dict[str, Any]]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise bad_request(
                    'response_format.json_schema.schema: required when type is "json_schema"',
                    param="response_format.json_schema.schema",
                    code=INVALID_CONSTRAINT,
                )
            found.append(("response_format.json_schema.schema", {"json": fmt.json_schema.schema_}))
        so = self.structured_outputs
        if so is not None:
            given = [(name, value) for name, value in _structured_outputs_items(so) if value is not None]
            if len(given) != 1:
                names = ", ".join(name for name, _ in given) or "none"
                raise bad_request(
                    f"structured_outputs: give exactly one of json, json_object, regex, choice, grammar (got {names})",
                    param="structured_outputs",
                    code=INVALID_CONSTRAINT,
                )
            name, value = given[0]
            if name == "json_object" and value is not True:
                raise bad_request(
                    "structured_outputs.json_object: must be true", param="structured_outputs.json_object",
                    code=INVALID_CONSTRAINT,
                )  # fmt: skip
            found.append((f"structured_outputs.{name}", {name: value}))
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice")):
            value = getattr(self, name)
            if value is not None:
                found.append((name, {key: value}))
        if self.guided_grammar is not None:
            found.append(("guided_grammar", {"grammar": self.guided_grammar}))
        return found


def _structured_outputs_items(so: StructuredOutputs) -> list[tuple[str, Any]]:
    return [
        ("json", so.json_),
        ("json_object", so.json_object),
        ("regex", so.regex),
        ("choice", so.choice),
        ("grammar", so.grammar),
    ]


def single_constraint(found: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]] | None:
    """The one constraint asked for, checked; None when none is; 400 when more than one is."""
    if not found:
        return None
    if len(found) > 1:
        first, second = found[0][0], found[1][0]
        raise bad_request(
            f"{second}: only one structured output constraint per request ({first} already gives one)",
            param=second,
            code=INVALID_CONSTRAINT,
        )
    field, constraint = found[0]
    return field, checked_constraint(field, constraint)


def checked_constraint(field: str, constraint: dict[str, Any]) -> dict[str, Any]:
    """The wire constraint of one request field, checked (400 naming `field` otherwise)."""
    (kind, value), *_ = constraint.items()
    try:
        if kind == "json":
            if isinstance(value, str):
                value = _schema_from_text(value, field)
            check_json_schema(value, field)
            constraint = {"json": value}
        elif kind == "regex":
            check_regex(value, field)
        elif kind == "grammar" and not value.strip():
            raise bad_request(f"{field}: the grammar is empty", param=field, code=INVALID_CONSTRAINT)
    except ValueError as exc:
        param = getattr(exc, "param", field)
        raise bad_request(f"{param}: {getattr(exc, 'message', exc)}", param=param, code=INVALID_CONSTRAINT) from None
    size = len(json.dumps(next(iter(constraint.values())), ensure_ascii=False))
    if size > MAX_STRUCTURED_OUTPUT_CHARS:
        raise bad_request(
            f"{field}: the constraint is {size} characters of JSON; the limit is {MAX_STRUCTURED_OUTPUT_CHARS}",
            param=field,
            code=INVALID_CONSTRAINT,
        )
    return constraint


def _schema_from_text(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise bad_request(f"{field}: is not valid JSON: {exc}", param=field, code=INVALID_CONSTRAINT) from None
