"""``dependencies``, ``dependentRequired`` and ``dependentSchemas``, rewritten exactly as ``anyOf`` cases.

llguidance does not implement them. Each one says "if the object has property *p*, then ...", which
is the same as "*p* is absent, or ...": ``anyOf: [{properties: {p: false}}, {required: [p, ...]}]``
for a list of names, and ``anyOf: [{properties: {p: false}}, {allOf: [{required: [p]}, S]}]`` for
a schema ``S``. For an instance that is not an object both sides hold, as the keyword does nothing
there. The cases join the schema's ``allOf``.
"""

from __future__ import annotations

from typing import Any

from llgtriton.json_schemas import rewritten

_KEYWORDS = ("dependencies", "dependentRequired", "dependentSchemas")


def dependencies_as_any_of(schema: Any) -> Any:
    """``schema`` with every dependency keyword written as ``allOf`` cases; the schema is not changed."""
    return rewritten(schema, _rewrite)


def _rewrite(node: dict[str, Any]) -> dict[str, Any]:
    cases: list[Any] = []
    for keyword in _KEYWORDS:
        dependencies = node.get(keyword)
        if not isinstance(dependencies, dict):
            continue
        for name, dependency in dependencies.items():
            case = _case(name, dependency)
            if case is None:
                return node  # not a form this can rewrite: llguidance names the keyword
            cases.append(case)
    if not cases:  # an empty dependency map asserts nothing (llguidance refuses the keyword all the same)
        return {key: value for key, value in node.items() if not (key in _KEYWORDS and value == {})}
    earlier = node.get("allOf", [])
    if not isinstance(earlier, list):
        return node
    kept = {key: value for key, value in node.items() if key not in _KEYWORDS}
    return {**kept, "allOf": [*earlier, *cases]}


def _case(name: str, dependency: Any) -> Any:
    absent = {"properties": {name: False}}
    if isinstance(dependency, list) and all(isinstance(required, str) for required in dependency):
        return {"anyOf": [absent, {"required": [name, *dependency]}]}
    if dependency is True:
        return True
    if dependency is False:
        return absent
    if isinstance(dependency, dict):
        return {"anyOf": [absent, {"allOf": [{"required": [name]}, dependency]}]}
    return None
