"""A ``oneOf`` admits no value of a type that two of its branches hold for whatever value it is.

Most keywords judge one JSON type only: ``properties``, ``required`` and the like hold for anything
that is not an object; ``pattern`` for anything not a string. A branch made of such keywords (and
annotations, or keys no draft defines, which validators ignore) holds for every value of the types
it does not judge. Where two branches of a ``oneOf`` hold for every value of a type, every such
value matches at least two, so the ``oneOf`` rejects it: the schema's ``type`` may say so, and the
schema is the same. ``oneOf: [{properties: ...}, {properties: ...}]`` (object branches without a
``type``) is then a ``oneOf`` among objects only, where :mod:`llgtriton.schema_one_of` can prove its
branches apart (a discriminating property) and llguidance's ``anyOf`` reading is exact.

A branch with any other keyword (``type``, ``const``, ``enum``, ``allOf``, ``not`` ...) is not
read. A local ``$ref`` is read at its target, together with the keywords beside it: both must hold.
"""

from __future__ import annotations

from typing import Any

from llgtriton.json_schemas import ANNOTATIONS, ref_chain, rewritten
from llgtriton.schema_judge import KEYWORDS

_ALL = ("array", "boolean", "integer", "null", "number", "object", "string")
# The one type each keyword judges; it holds for a value of any other type.
_JUDGES = {
    **dict.fromkeys(
        (
            *("properties", "required", "additionalProperties", "patternProperties", "minProperties"),
            *("maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames"),
            "unevaluatedProperties",
        ),
        "object",
    ),
    **dict.fromkeys(
        (
            *("items", "additionalItems", "prefixItems", "contains", "minContains", "maxContains"),
            *("minItems", "maxItems", "uniqueItems", "unevaluatedItems"),
        ),
        "array",
    ),
    **dict.fromkeys(
        ("pattern", "minLength", "maxLength", "format", "contentEncoding", "contentMediaType", "contentSchema"),
        "string",
    ),
    **dict.fromkeys(
        ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "divisibleBy"), "number"
    ),
}
# Keys that judge nothing here (definitions are only read through a $ref).
_INERT = frozenset({"$schema", "$id", "id", "$comment", "definitions", "$defs"}) | ANNOTATIONS


def one_of_types_narrowed(schema: Any) -> Any:
    """``schema`` with the ``type`` of every schema holding a ``oneOf`` narrowed by the types two of its
    branches hold for whatever value; the schema is not changed."""
    return rewritten(schema, lambda node: _narrowed(schema, node))


def _narrowed(root: Any, node: dict[str, Any]) -> dict[str, Any]:
    branches = node.get("oneOf")
    if not isinstance(branches, list) or len(branches) < 2:
        return node
    holding: dict[str, int] = {}
    for branch in branches:
        for kind in _held_through_refs(root, branch):
            holding[kind] = holding.get(kind, 0) + 1
    excluded = {kind for kind, count in holding.items() if count >= 2}
    if "number" in excluded:
        excluded.add("integer")
    declared = node.get("type", list(_ALL))
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not all(name in _ALL for name in names):
        return node
    left = [name for name in names if name not in excluded]
    if left == names or not left:  # nothing to say, or nothing left (llguidance names the schema as unsatisfiable)
        return node
    return {**node, "type": left[0] if len(left) == 1 else left}


def _held_through_refs(root: Any, branch: Any) -> frozenset[str]:
    """As :func:`_held_for_every_value`, a local ``$ref`` read at its target together with the
    keywords beside each ``$ref`` on the way (all must hold)."""
    chain = ref_chain(root, branch)
    if chain is None:
        return frozenset()
    held = _held_for_every_value(chain.target)
    for beside in chain.beside:
        held &= _held_for_every_value(beside)
    return held


def _held_for_every_value(branch: Any) -> frozenset[str]:
    """The types (``integer`` within ``number``) every value of which ``branch`` holds for."""
    if branch is True:
        return frozenset(_ALL) - {"integer"}
    if not isinstance(branch, dict):
        return frozenset()
    judged: set[str] = set()
    for key in branch:
        if key in _JUDGES:
            judged.add(_JUDGES[key])
        elif key in KEYWORDS and key not in _INERT:
            return frozenset()  # a keyword that may judge any type
    return frozenset(_ALL) - {"integer"} - judged
