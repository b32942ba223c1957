"""JSON Schema's ``format``: asserted where llguidance implements it exactly, an annotation elsewhere.

JSON Schema 2020-12 makes ``format`` an annotation unless a validator is told to assert it, and
the common validators (Python's ``jsonschema`` among them) ignore it by default. llgtriton asserts
the formats llguidance builds exact grammars for (:data:`ASSERTED_FORMATS`); any other value
(OpenAPI's ``int32`` and ``password``, ``uri-reference``, a project's own name) is the annotation
the specification says it is: the schema is served with every other keyword enforced, where it
used to be refused as a whole. ``docs/api.md`` says so to users.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llgtriton.json_schemas import ONE_SCHEMA, SCHEMA_LISTS, SCHEMA_MAPS

# What llguidance 1.x asserts; it refuses any other name ("Unknown format").
ASSERTED_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid", "unknown"}
)


def annotations_only(schema: Any, unasserted: Callable[[str], None] = lambda name: None) -> Any:
    """``schema`` without the ``format`` values llguidance does not assert (``unasserted`` hears each
    one); the schema itself is not changed."""
    if not isinstance(schema, dict):
        return schema
    rewritten: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "format" and isinstance(value, str) and value not in ASSERTED_FORMATS:
            unasserted(value)
            continue
        rewritten[key] = _subschemas(key, value, unasserted)
    return rewritten


def _subschemas(key: str, value: Any, unasserted: Callable[[str], None]) -> Any:
    if key in SCHEMA_MAPS and isinstance(value, dict):
        return {name: annotations_only(item, unasserted) for name, item in value.items()}
    if key in SCHEMA_LISTS and isinstance(value, list):
        return [annotations_only(item, unasserted) for item in value]
    if key in ONE_SCHEMA:
        return annotations_only(value, unasserted)
    return value
