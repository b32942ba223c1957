"""``not``, rewritten where its complement is exact; llguidance does not implement the keyword.

The forms served, each as what it leaves of the schema it sits in:
- ``not: {}`` (or ``true``): nothing; ``not: false``: no constraint.
- ``not: {required: [a, b]}``: an object lacking ``a`` or ``b`` (``required`` holds for anything
  that is not an object, so its complement holds only for objects).
- ``not: {type: T}``: the schema's types less ``T``. ``number`` takes ``integer`` with it; ``not:
  {type: integer}`` is served only where the schema allows no other numbers (what remains, the
  numbers with a fraction, has no exact form).
- ``not: {const: c}`` or ``not: {enum: [...]}``: where the schema itself is a ``const`` or an
  ``enum``, those values taken out of it.
Any other ``not`` is left as it is, and llguidance's refusal names the keyword.
"""

from __future__ import annotations

import json
from typing import Any

from llgtriton.json_schemas import rewritten

TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def not_as_complement(schema: Any) -> Any:
    """``schema`` with every ``not`` of a served form written as its complement; the schema is not changed."""
    return rewritten(schema, _rewrite)


def _rewrite(node: dict[str, Any]) -> dict[str, Any]:
    if "not" not in node:
        return node
    negated, rest = node["not"], {key: value for key, value in node.items() if key != "not"}
    if negated is False:
        return rest
    if negated is True or negated == {}:
        return _joined(rest, False) or node
    if not isinstance(negated, dict) or len(negated) != 1:
        return node
    ((keyword, value),) = negated.items()
    complement = None
    if keyword == "required":
        complement = _not_required(rest, value)
    elif keyword == "type":
        complement = _not_type(rest, value)
    elif keyword in ("const", "enum"):
        complement = _not_values(rest, [value] if keyword == "const" else value)
    return node if complement is None else complement


def _joined(rest: dict[str, Any], *cases: Any) -> dict[str, Any] | None:
    earlier = rest.get("allOf", [])
    if not isinstance(earlier, list):
        return None
    return {**rest, "allOf": [*earlier, *cases]}


def _not_required(rest: dict[str, Any], names: Any) -> dict[str, Any] | None:
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        return None
    if not names:  # required: [] always holds
        return _joined(rest, False)
    lacking = {"anyOf": [{"properties": {name: False}} for name in dict.fromkeys(names)]}
    return _joined(rest, {"type": "object"}, lacking)


def _types(value: Any) -> set[str] | None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(name in TYPES for name in names):
        return None
    return set(names)


def _not_type(rest: dict[str, Any], value: Any) -> dict[str, Any] | None:
    excluded = _types(value)
    allowed = _types(rest.get("type", list(TYPES)))
    if excluded is None or allowed is None:
        return None
    if "number" in allowed:  # "number" holds the integers too
        allowed.add("integer")
    if "number" in excluded:
        excluded.add("integer")
    left = allowed - excluded
    if "integer" in excluded and "number" in left:
        return None  # the numbers that are not integers: no exact form
    if "number" in left:
        left.discard("integer")
    if not left:
        return _joined(rest, False)
    return {**rest, "type": sorted(left)}


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 and 1.0 are equal, true and 1 are not (as the validators judge const and enum)."""
    return json.dumps(_canonical(a), sort_keys=True) == json.dumps(_canonical(b), sort_keys=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return ["number", float(value)] if float(value) == value else ["number", repr(value)]
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    return repr(value)


def _not_values(rest: dict[str, Any], excluded: Any) -> dict[str, Any] | None:
    if not isinstance(excluded, list):
        return None
    if "const" in rest:
        if any(_same(rest["const"], value) for value in excluded):
            return _joined(rest, False)
        return rest
    if isinstance(rest.get("enum"), list):
        kept = [item for item in rest["enum"] if not any(_same(item, value) for value in excluded)]
        if not kept:
            return _joined({key: value for key, value in rest.items() if key != "enum"}, False)
        return {**rest, "enum": kept}
    return None
