"""``propertyNames`` that llguidance does not implement, written exactly where the names are known or free.

- A ``propertyNames`` every string satisfies (``true``, ``{}``, ``{"type": "string"}``, annotations
  only) judges nothing, since every property name is a string: it is dropped.
- A ``propertyNames`` of listed names (``enum`` or ``const``, strings) allows those names only: each
  becomes a property (with the ``additionalProperties`` schema where ``properties`` does not name it),
  a named property outside the list is forbidden, and ``additionalProperties`` becomes false. Where
  ``patternProperties`` or ``unevaluatedProperties`` also judges names, the keyword is left as it is.

Any other ``propertyNames`` is left, and llguidance's refusal names it.
"""

from __future__ import annotations

import json
from typing import Any

from llgtriton.json_schemas import ANNOTATIONS, named_values, rewritten

# Each listed name the properties do not name gets a copy of additionalProperties: at most this many
# bytes of them, so that a request cannot make a schema many times its own size.
MAX_COPIED_BYTES = 1 << 20


def property_names_written_out(schema: Any) -> Any:
    """``schema`` with every ``propertyNames`` that has an exact rewrite rewritten; the schema is not changed."""
    return rewritten(schema, _written_out)


def _written_out(node: dict[str, Any]) -> dict[str, Any]:
    if "propertyNames" not in node:
        return node
    names = node["propertyNames"]
    rest = {key: value for key, value in node.items() if key != "propertyNames"}
    if _every_string(names):
        return rest
    listed = _listed(names)
    if listed is None or "patternProperties" in node or "unevaluatedProperties" in node:
        return node  # (other keywords judge names too: writing them out would not be exact)
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        return node
    extra = node.get("additionalProperties", True)
    unnamed = [name for name in listed if name not in properties]
    if unnamed and not isinstance(extra, bool) and len(unnamed) * len(json.dumps(extra)) > MAX_COPIED_BYTES:
        return node  # (a small schema must not grow into a huge one: left, and refused naming the keyword)
    # (The named properties keep their order: llguidance writes properties in the schema's order.)
    kept = {name: (schema if name in listed else False) for name, schema in properties.items()}
    added = {name: extra for name in unnamed}
    return {**rest, "properties": {**kept, **added}, "additionalProperties": False}


def _every_string(names: Any) -> bool:
    if names is True:
        return True
    if not isinstance(names, dict):
        return False
    judging = {key: value for key, value in names.items() if key not in ANNOTATIONS}
    return judging in ({}, {"type": "string"}) or (
        set(judging) == {"type"} and isinstance(judging["type"], list) and "string" in judging["type"]
    )


def _listed(names: Any) -> list[str] | None:
    """The names a ``propertyNames`` of only ``enum`` or ``const`` (and annotations) allows, or None."""
    if not isinstance(names, dict):
        return None
    judging = {key: value for key, value in names.items() if key not in ANNOTATIONS and key != "type"}
    values = named_values(judging)
    if names.get("type", "string") != "string" or len(judging) != 1 or values is None:
        return None
    if not all(isinstance(value, str) for value in values):
        return None
    return list(dict.fromkeys(values))
