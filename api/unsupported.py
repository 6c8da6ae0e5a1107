"""Request content inferq refuses before validating types: unsupported OpenAI features, broken text.

Refusing by name (400 "'tools' is not supported by this server") tells a client what to change;
silently ignoring `tools` or `response_format` would return an answer of the wrong kind.
These checks run on the raw JSON object, before pydantic, so they also hold for fields the
request models do not declare.
"""

from __future__ import annotations

from typing import Any

from api.errors import FieldError

# Fields of OpenAI features this server does not implement, and the values that mean "not used".
_UNSUPPORTED_COMMON: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}


def reject_unsupported(data: Any, extra: dict[str, tuple[Any, ...]]) -> Any:
    """Raise FieldError naming the first field of an unsupported feature that is in use."""
    if not isinstance(data, dict):
        return data
    for name, allowed in {**_UNSUPPORTED_COMMON, **extra}.items():
        if name in data and data[name] not in allowed:
            raise FieldError(name, f"'{name}' is not supported by this server")
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise FieldError("response_format", 'only {"type": "text"} is supported')
    modalities = data.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise FieldError("modalities", 'only ["text"] is supported')
    return data


# JSON values that hold no string.
_SCALARS = frozenset({int, float, bool, type(None)})


def invalid_unicode_path(value: Any, path: str) -> str | None:
    """Where a string holds an unpaired surrogate (JSON allows "\\ud800"; UTF-8 cannot encode it)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
    elif isinstance(value, dict):
        for key, item in value.items():
            found = invalid_unicode_path(key, path) or invalid_unicode_path(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list):
        if set(map(type, value)) <= _SCALARS:  # token ids: no string inside (checked in C, not per item)
            return None
        for i, item in enumerate(value):
            if found := invalid_unicode_path(item, f"{path}[{i}]"):
                return found
    return None
