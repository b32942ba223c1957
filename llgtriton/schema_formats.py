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

from llgtriton.json_schemas import rewritten

# What llguidance 1.x asserts; it refuses any other name ("Unknown format").
ASSERTED_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid", "unknown"}
)


def annotations_only(schema: Any, unasserted: Callable[[str], None] = lambda name: None) -> Any:
    """``schema`` without the ``format`` values llguidance does not assert (``unasserted`` hears each
    one); the schema itself is not changed."""

    def drop_format(node: dict[str, Any]) -> dict[str, Any]:
        name = node.get("format")
        if not isinstance(name, str) or name in ASSERTED_FORMATS:
            return node
        unasserted(name)
        return {key: value for key, value in node.items() if key != "format"}

    return rewritten(schema, drop_format)
