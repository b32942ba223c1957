"""``$ref`` beside other keywords in a draft-03 to draft-07 schema: the others are ignored there.

Up to draft 7, a schema holding ``$ref`` is the schema it names, and every other keyword in it is
ignored (draft 2019-09 made them apply too). llguidance applies them, and refuses them beside a
``$ref`` that leads back to itself. For a schema whose ``$schema`` names one of those drafts (as the
``jsonschema`` validator reads it) they are dropped, which is what that draft says; ``definitions``
and ``$defs`` stay, as other ``$ref``s may point into them. A schema of a later draft, or that names
none, is left alone.
"""

from __future__ import annotations

from typing import Any

from llgtriton.json_schemas import rewritten

_OLD_DRAFTS = ("draft-03/", "draft-04/", "draft-06/", "draft-07/")
_KEPT = frozenset({"$ref", "definitions", "$defs"})


def ref_siblings_ignored(schema: Any) -> Any:
    """``schema`` as its draft reads it: without the keywords beside a ``$ref`` where the draft ignores
    them; the schema is not changed."""
    if not (isinstance(schema, dict) and _old_draft(schema.get("$schema"))):
        return schema

    def alone(node: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(node.get("$ref"), str):
            return node
        return {key: value for key, value in node.items() if key in _KEPT}

    dropped = rewritten(schema, alone)
    return {**dropped, "$schema": schema["$schema"]} if "$ref" in schema else dropped


def _old_draft(uri: Any) -> bool:
    return isinstance(uri, str) and any(draft in uri for draft in _OLD_DRAFTS)
