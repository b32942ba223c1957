"""``minProperties: 1`` beside optional properties, written as cases over which member is present.

llguidance implements ``minProperties``/``maxProperties`` only where the properties that
``properties`` names are required (enough of them to meet the bound), and refuses the schema
otherwise. An object has a member exactly when one of the named properties is present, or none is
and another member is:
``anyOf: [{required: [p]} for each named p] + [{properties: {every named p: false}, minProperties: 1}]``,
the last case left out where no other member is allowed (``additionalProperties: false`` and no
``patternProperties``). Every case judges objects only, as ``minProperties`` does, so a value of
another type is judged as before. A schema with a ``required`` property, a ``maxProperties``, or
a larger bound is left as it is (llguidance serves the first, and names the others).
"""

from __future__ import annotations

from typing import Any

from llgtriton.json_schemas import rewritten

MAX_NAMED = 256  # named properties written out as cases, each one a small schema


def min_properties_as_cases(schema: Any) -> Any:
    """``schema`` with every ``minProperties: 1`` among optional properties written as cases; the
    schema is not changed."""
    return rewritten(schema, _as_cases)


def _as_cases(node: dict[str, Any]) -> dict[str, Any]:
    bound, declared, earlier = node.get("minProperties"), node.get("properties"), node.get("allOf", [])
    if not (type(bound) is int and bound == 1 and isinstance(declared, dict) and declared):
        return node
    if not isinstance(earlier, list) or node.get("required") or "maxProperties" in node or len(declared) > MAX_NAMED:
        return node
    cases: list[Any] = [{"required": [name]} for name in declared]
    closed = node.get("additionalProperties") is False and not node.get("patternProperties")
    if not closed:
        cases.append({"properties": dict.fromkeys(declared, False), "minProperties": 1})
    rest = {key: value for key, value in node.items() if key != "minProperties"}
    return {**rest, "allOf": [*earlier, {"anyOf": cases}]}
