"""JSON-schema rewrites that make the model's output what OpenAI's clients expect.

Under ``strict: true`` OpenAI requires closed objects, and tool arguments are read by code that
knows only the declared parameters. A schema that declares ``properties`` but says nothing about
others left llguidance free to add undeclared keys, even the same key again and again, until
``max_tokens`` ran out. Such objects are closed here; a schema that opens them explicitly
(``additionalProperties``, ``patternProperties`` or ``unevaluatedProperties``) keeps its word.
"""

from __future__ import annotations

from typing import Any

_OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# Keywords whose values are schemas, or maps or lists of schemas, where objects may nest.
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMAS = ("items", "additionalItems", "not", "if", "then", "else", "contains", *_OPENERS)


def closed_objects(schema: Any) -> Any:
    """``schema`` with every object that declares ``properties`` and says nothing of others closed."""
    if not isinstance(schema, dict):
        return schema
    result = dict(schema)
    if isinstance(schema.get("properties"), dict) and not any(key in schema for key in _OPENERS):
        result["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            result[key] = {name: closed_objects(value) for name, value in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            result[key] = [closed_objects(value) for value in schema[key]]
    for key in _SCHEMAS:
        if isinstance(schema.get(key), dict):
            result[key] = closed_objects(schema[key])
    return result
