"""Fifty JSON Schemas of increasing difficulty for the end-to-end structured output test: scalars, enums and
bounds first, then patterns, formats, arrays, nested objects, references and unions. Every string has a
maxLength and every array a maxItems, so a valid answer fits the test's max_tokens."""

from __future__ import annotations

from typing import Any


def obj(required: bool = True, **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(properties)
    return schema


def text(n: int = 10, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "maxLength": n, **extra}


def integer(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def array(items: dict[str, Any], hi: int, lo: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


COLOR = {"enum": ["red", "green", "blue"]}
SKU = text(5, pattern="^[A-Z]{2}[0-9]{3}$")
POINT = obj(x=integer(-9, 9), y=integer(-9, 9))

SCHEMAS: list[dict[str, Any]] = [
    {"type": "boolean"},
    integer(0, 100),
    text(10),
    COLOR,
    {"type": "number", "minimum": -10, "maximum": 10},
    {"type": "null"},
    {"const": "fixed"},
    array(integer(0, 9), 3),
    obj(name=text(12)),
    obj(name=text(12), age=integer(0, 120)),
    obj(ok={"type": "boolean"}, color=COLOR),
    text(6, pattern="^[a-z]{3,6}$"),
    text(8, pattern="^[0-9]{3}-[0-9]{4}$"),
    {"type": "string", "format": "date"},
    array(COLOR, 3, 1),
    obj(required=False, nickname=text(8), score=integer(0, 10)),
    obj(person=obj(name=text(10), age=integer(1, 99))),
    array(POINT, 2),
    {"anyOf": [integer(0, 50), text(5)]},
    {"type": ["string", "null"], "maxLength": 5},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"type": "number", "minimum": 0.5, "maximum": 1.5},
    text(8, minLength=3),
    obj(id=integer(1, 999), label=text(8), active={"type": "boolean"}, color=COLOR),
    {"type": "array", "prefixItems": [text(6), integer(0, 9)], "minItems": 2, "maxItems": 2},
    {"$defs": {"point": POINT}, **obj(a={"$ref": "#/$defs/point"}, b={"$ref": "#/$defs/point"})},
    {"enum": [1, "two", True, None]},
    {"const": 42},
    obj(title=text(12), tags=array(text(8), 3)),
    array({"type": "boolean"}, 2, 2),
    {"allOf": [obj(k=integer(1, 5))]},
    {"oneOf": [{"type": "boolean"}, integer(0, 3)]},
    obj(sku=SKU, price={"type": "number", "minimum": 0, "maximum": 1000}, category={"enum": ["tool", "toy", "food"]}),
    obj(a=obj(b=obj(c=integer(0, 9)))),
    array(obj(size={"enum": ["S", "M", "L"]}, color=COLOR), 3, 1),
    {"type": "string", "format": "uuid"},
    obj(values=array(integer(-5, 5), 4, 1)),
    obj(title=text(20), day={"type": "string", "format": "date"}, attendees=array(text(10), 3)),
    obj(a={"type": "boolean"}, b={"type": "boolean"}, c={"type": "boolean"}, n=integer(0, 3)),
    array(array(integer(0, 9), 2), 2),
    {"anyOf": [obj(kind={"const": "circle"}, radius=integer(1, 9)),
               obj(kind={"const": "square"}, side=integer(1, 9))]},
    obj(low={"type": ["integer", "null"], "minimum": 0, "maximum": 9},
        high={"type": ["integer", "null"], "minimum": 0, "maximum": 99}),
    obj(level={"enum": ["low", "mid", "high"]}, depth=integer(-50, -10)),
    {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1},
    {"$defs": {"name": text(10), "person": obj(name={"$ref": "#/$defs/name"}, age=integer(0, 99))},
     **obj(owner={"$ref": "#/$defs/person"})},
    obj(id=integer(1, 99), items=array(obj(sku=SKU, qty=integer(1, 9)), 2, 1),
        status={"enum": ["new", "paid", "sent"]}),
    obj(at=text(5, pattern="^([01][0-9]|2[0-3]):[0-5][0-9]$"), note=text(10)),
    obj(name=text(10), age=integer(0, 99), email=text(20, pattern="^[a-z]{1,8}@[a-z]{1,8}\\.com$"),
        address=obj(street=text(16), city=text(10), zip=text(5, pattern="^[0-9]{5}$")),
        tags=array({"enum": ["a", "b", "c"]}, 2)),
    obj(matrix=array(array(integer(0, 1), 3, 3), 2, 2), label=text(6)),
    obj(status={"enum": ["ok", "error"]},
        data=obj(users=array(obj(id=integer(1, 999), name=text(10), active={"type": "boolean"},
                                 roles=array({"enum": ["admin", "dev"]}, 2)), 2),
                 total=integer(0, 10)),
        error={"type": "null"}),
]  # fmt: skip
