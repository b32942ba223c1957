"""``oneOf`` served exactly where no instance can match two of its branches.

``oneOf`` asks that exactly one branch match; llguidance refuses it unless told to read it as
``anyOf`` (its ``coerce_one_of``), which also accepts an instance that matches several. Where
every pair of branches is provably disjoint the two are the same, so the schema compiles with
that option and nothing is approximated. Two branches are disjoint here when

- the JSON types they admit do not meet (``integer`` counts as a ``number``), or
- both admit only objects, and a property both require has a ``const``/``enum`` in each whose
  values do not meet (a discriminator), or one requires a property the other forbids.

Anything else (patterns, ``required``-only branches, ``allOf``, remote ``$ref``s) is not proven,
and the schema stays a 400 naming ``oneOf``. ``$ref``s to the schema's own parts are followed; a
branch's ``$ref`` is read alone (older drafts ignore its siblings), which only ever proves less.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llgtriton.json_schemas import local_target, subschemas

_TYPES = frozenset({"null", "boolean", "object", "array", "string", "number"})
_MAX_REFS = 32  # $refs followed to reach one branch's own keywords


def every_one_of_is_disjoint(root: Any) -> bool:
    """Whether ``root`` has a ``oneOf`` and every ``oneOf`` in it has pairwise disjoint branches."""
    found = False
    for node in _schemas(root):
        branches = node.get("oneOf")
        if not isinstance(branches, list):
            continue
        found = True
        resolved = [_resolve(root, branch) for branch in branches]
        for index, first in enumerate(resolved):
            if not all(_disjoint(root, first, second) for second in resolved[index + 1 :]):
                return False
    return found


def _schemas(root: Any) -> Iterator[dict[str, Any]]:
    pending, seen = [root], set()
    while pending:
        node = pending.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        pending.extend(subschemas(node))


def _resolve(root: Any, schema: Any) -> Any:
    """``schema`` with its local ``$ref``s followed (None for one that cannot be)."""
    for _ in range(_MAX_REFS):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema
        schema = local_target(root, schema["$ref"])
    return None


def _types(schema: Any) -> frozenset[str]:
    """The JSON types ``schema`` may admit (more, never fewer)."""
    if schema is False:
        return frozenset()
    if not isinstance(schema, dict):
        return _TYPES
    declared = schema.get("type")
    if isinstance(declared, str):
        declared = [declared]
    if isinstance(declared, list) and all(isinstance(name, str) for name in declared):
        return frozenset("number" if name == "integer" else name for name in declared) & _TYPES
    if "const" in schema:
        return frozenset({_type_of(schema["const"])})
    if isinstance(schema.get("enum"), list):
        return frozenset(_type_of(value) for value in schema["enum"])
    return _TYPES


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _disjoint(root: Any, first: Any, second: Any) -> bool:
    if first is None or second is None:
        return False
    first_types, second_types = _types(first), _types(second)
    if not first_types & second_types:
        return True
    objects = frozenset({"object"})
    if not (first_types <= objects and second_types <= objects):
        return False
    return (
        _discriminated(root, first, second)
        or _requires_what_is_forbidden(root, first, second)
        or _requires_what_is_forbidden(root, second, first)
    )


def _required(schema: dict[str, Any]) -> set[str]:
    required = schema.get("required")
    return {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()


def _property(root: Any, schema: dict[str, Any], name: str) -> Any:
    properties = schema.get("properties")
    return _resolve(root, properties.get(name)) if isinstance(properties, dict) and name in properties else None


def _values(schema: Any) -> set[str] | None:
    """The values ``schema`` allows, as canonical JSON, when it names them (``const``, ``enum``)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {json.dumps(schema["const"], sort_keys=True)}
    if isinstance(schema.get("enum"), list):
        return {json.dumps(value, sort_keys=True) for value in schema["enum"]}
    return None


def _discriminated(root: Any, first: dict[str, Any], second: dict[str, Any]) -> bool:
    for name in _required(first) & _required(second):
        mine, theirs = _values(_property(root, first, name)), _values(_property(root, second, name))
        if mine is not None and theirs is not None and not mine & theirs:
            return True
    return False


def _requires_what_is_forbidden(root: Any, first: dict[str, Any], second: dict[str, Any]) -> bool:
    declared = second.get("properties")
    properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
    closed = second.get("additionalProperties") is False and not second.get("patternProperties")
    for name in _required(first):
        if name in properties:
            if _resolve(root, properties[name]) is False:
                return True
        elif closed:
            return True
    return False
