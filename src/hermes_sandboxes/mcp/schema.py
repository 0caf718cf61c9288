"""The JSON Schema subset the tools' input schemas use, checked before a tool runs.

A model's arguments are checked against the schema the tool advertised, so a wrong type or a
missing field is a tool error that names the field and says what was expected, never a crash
deep inside a handler. Supported: ``type`` (one or a list), ``properties``, ``required``,
``additionalProperties: false``, ``items``, ``enum``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``minItems``/``maxItems``, ``pattern``.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),),
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False  # True is an int to Python, not to JSON
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[kind])


def errors(schema: dict[str, Any], value: Any, where: str = "arguments") -> list[str]:
    """What is wrong with ``value`` against ``schema``, one sentence per problem (empty: valid)."""
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(value, k) for k in allowed):
            return [f"{where} must be {' or '.join(allowed)}, got {_kind(value)}"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where} must be one of {', '.join(map(repr, schema['enum']))}, got {value!r}")
    if isinstance(value, str):
        problems += _bounds(where, len(value), schema, "minLength", "maxLength", "characters")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            problems.append(f"{where} must match {schema['pattern']}, got {value!r}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where} must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where} must be at most {schema['maximum']}, got {value}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            problems.append(f"{where} must be more than {schema['exclusiveMinimum']}, got {value}")
    elif isinstance(value, list):
        problems += _bounds(where, len(value), schema, "minItems", "maxItems", "items")
        item_schema = schema.get("items")
        if isinstance(item_schema, dict):
            for index, item in enumerate(value):
                problems += errors(item_schema, item, f"{where}[{index}]")
    elif isinstance(value, dict):
        problems += _object(schema, value, where)
    return problems


def _object(schema: dict[str, Any], value: dict[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    properties: dict[str, Any] = schema.get("properties") or {}
    for name in schema.get("required") or ():
        if name not in value:
            problems.append(f"{where}.{name} is required")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            problems += errors(properties[name], item, f"{where}.{name}")
        elif extra is False:
            known = ", ".join(properties) or "none"
            problems.append(f"{where}.{name} is not an argument of this tool (its arguments: {known})")
        elif isinstance(extra, dict):
            problems += errors(extra, item, f"{where}.{name}")
    return problems


def _bounds(where: str, size: int, schema: dict[str, Any], low: str, high: str, unit: str) -> list[str]:
    if low in schema and size < schema[low]:
        return [f"{where} must have at least {schema[low]} {unit}, got {size}"]
    if high in schema and size > schema[high]:
        return [f"{where} must have at most {schema[high]} {unit}, got {size}"]
    return []


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", dict: "object", list: "array"}
    return names.get(type(value), type(value).__name__)
