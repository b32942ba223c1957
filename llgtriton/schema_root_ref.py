"""A schema that refers to its own root (``{"$ref": "#"}``), its root moved into ``$defs``.

llguidance compiles the root in place, and refuses a cycle back to it through a schema with keywords
beside the ``$ref`` ("circular references with sibling keys", e.g. a GeoJSON geometry whose
``oneOf`` branch is a collection of geometries, ``items: {"$ref": "#"}``); the same cycle through a
schema in ``$defs`` it serves. The root's keywords are moved into ``$defs`` as they are, the root
becomes a ``$ref`` to them, and every ``$ref`` follows: ``#`` to the moved schema, ``#/p...`` to the
same place inside it; ``#/$defs/...`` and ``#/definitions/...`` stay at the root, and so do they. The
schema means the same: every ``$ref`` names the schema it named.

Only where that is certain: every ``$ref`` is a JSON pointer into the document (a base URI no longer
matters; a plain-name anchor is left to llguidance), no schema inside
declares an ``$id`` or ``id`` of its own (``#`` would then be that schema), and there is no
``$anchor``, ``$dynamicRef`` or ``$recursiveRef`` anywhere.
"""

from __future__ import annotations

from typing import Any

from llgtriton.json_schemas import pointer_parts, refs, rewritten, subschemas

ROOT_NAME = "llgtriton-root"
_ROOT_REF = f"#/$defs/{ROOT_NAME}"
_STAY_AT_ROOT = ("$schema", "$id", "id", "$defs", "definitions")
_DEFINITIONS = ("$defs", "definitions")
_UNSURE = frozenset({"$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveAnchor", "$recursiveRef"})


def root_ref_into_defs(schema: Any) -> Any:
    """``schema`` with its root moved into ``$defs`` where some ``$ref`` is ``#``; ``schema`` is not changed."""
    if not (isinstance(schema, dict) and isinstance(schema.get("$defs", {}), dict)):
        return schema
    if ROOT_NAME in schema.get("$defs", {}):
        return schema
    every_ref = list(refs(schema))
    if "#" not in every_ref or not all(
        isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) for ref in every_ref
    ):
        return schema
    if _UNSURE.intersection(schema) or any(_unsure(inner) for inner in subschemas(schema)):
        return schema

    def repointed(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        if not isinstance(ref, str) or (pointer_parts(ref) or ("",))[0] in _DEFINITIONS:
            return node
        return {**node, "$ref": _ROOT_REF + ref[1:]}  # "#" and "#/p..." alike: the same place in the moved root

    moved = rewritten(schema, repointed)
    body = {key: value for key, value in moved.items() if key not in _STAY_AT_ROOT}
    kept = {key: value for key, value in moved.items() if key in _STAY_AT_ROOT}
    return {**kept, "$ref": _ROOT_REF, "$defs": {**moved.get("$defs", {}), ROOT_NAME: body}}


def _unsure(node: Any) -> bool:
    """Whether ``node`` or a schema inside it declares its own base URI or an anchor."""
    if not isinstance(node, dict):
        return False
    if _UNSURE.intersection(node) or isinstance(node.get("$id"), str) or isinstance(node.get("id"), str):
        return True
    return any(_unsure(inner) for inner in subschemas(node))
