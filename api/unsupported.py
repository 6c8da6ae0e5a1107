"""Request content inferq refuses before validating types: unsupported OpenAI features, broken text.

Refusing by name (400 "'functions' is not supported by this server") tells a client what to change;
silently ignoring `functions` or `audio` would return an answer of the wrong kind. (`tools`,
`response_format` and the `guided_*` fields are served: api/tool_request.py, api/structured_output.py.)
These checks run on the raw JSON object, before pydantic, so they also hold for fields the
request models do not declare.
"""

from __future__ import annotations

import json
from typing import Any

from api.errors import FieldError

# Fields of OpenAI features this server does not implement, and the values that mean "not used".
_UNSUPPORTED_COMMON: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
}


def is_one_of(value: Any, allowed: tuple[Any, ...]) -> bool:
    # NOTE: by JSON type and value, as the published schema's "enum" compares (in Python 0 == False).
    return any(type(value) is type(choice) and value == choice for choice in allowed)


def reject_unsupported(data: Any, extra: dict[str, tuple[Any, ...]]) -> Any:
    """Raise FieldError naming the first field of an unsupported feature that is in use."""
    if not isinstance(data, dict):
        return data
    for name, allowed in {**_UNSUPPORTED_COMMON, **extra}.items():
        if name in data and not is_one_of(data[name], allowed):
            raise FieldError(name, f"'{name}' is not supported by this server")
    modalities = data.get("modalities")
    if modalities is not None and not is_one_of(modalities, (["text"],)):
        raise FieldError("modalities", 'only ["text"] is supported')
    return data


def unsupported_properties(extra: dict[str, tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    """The published schema of the fields above (and `extra`): each admits only its "not used" values."""
    properties: dict[str, dict[str, Any]] = {
        name: {"enum": list(allowed), "description": f"Not supported by this server: only {json.dumps(list(allowed))}."}
        for name, allowed in {**_UNSUPPORTED_COMMON, **extra}.items()
    }
    properties["modalities"] = {"anyOf": [{"type": "null"}, {"const": ["text"]}], "description": 'Only ["text"].'}
    return properties


# JSON values that hold no string.
_SCALARS = frozenset({int, float, bool, type(None)})


def _is_valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_name(text: str) -> str:
    """`text` with its unpaired surrogates written as \\udXXX escapes (a reply must be valid UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid_unicode_path(value: Any, path: str) -> str | None:
    """Where a string holds an unpaired surrogate (JSON allows "\\ud800"; UTF-8 cannot encode it).

    The path names the field ("messages[0].content"), the object key itself when the key is the
    broken string (its surrogates escaped), and "" for the top-level value itself.
    """
    if isinstance(value, str):
        return None if _is_valid_unicode(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            key_path = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not _is_valid_unicode(key):
                return f"{path}.{printable_name(key)}" if path else printable_name(key)
            if (found := invalid_unicode_path(item, key_path)) is not None:
                return found
    elif isinstance(value, list):
        if set(map(type, value)) <= _SCALARS:  # token ids: no string inside (checked in C, not per item)
            return None
        for i, item in enumerate(value):
            if (found := invalid_unicode_path(item, f"{path}[{i}]")) is not None:
                return found
    return None
