"""``not``, rewritten where its complement is exact; llguidance does not implement the keyword.

A ``not: N`` whose complement has an exact schema ``C`` becomes ``allOf: [..., C]`` in its schema.
The complements known:
- ``{}`` or ``true``: nothing (``false``); ``false``: anything (the ``not`` is dropped).
- ``{not: S}``: ``S``. ``{anyOf: [A, B]}``: ``allOf`` of their complements; ``{allOf: [A, B]}``:
  ``anyOf`` of theirs (De Morgan), each of which must be known.
- ``{required: [a, b]}``: an object lacking ``a`` or ``b`` (``required`` holds for anything that is
  not an object, so its complement holds only for objects).
- ``{type: T}``: the other types. ``number`` takes ``integer`` with it; ``{type: integer}`` is known
  only where the schema allows no other numbers (the numbers with a fraction have no exact form).
- ``{maximum: m}``: a number above ``m``; likewise ``minimum``, ``exclusiveMaximum``,
  ``exclusiveMinimum`` (a bound says nothing of what is not a number).
- ``{minItems: n}``: an array of at most n - 1 items; likewise ``maxItems``, ``minLength``,
  ``maxLength``.
- ``{const: c}`` or ``{enum: [...]}`` directly in a schema that is itself a ``const`` or an ``enum``:
  those values taken out of it; elsewhere, every other value, where the values are scalars
  (:mod:`llgtriton.schema_values`).
- ``{properties: {p: S}}``: an object holding ``p`` whose value is not ``S``.
- ``{$ref: "#/..."}`` alone: the complement of the schema it points at in the same document (a
  ``$ref`` alone is that schema), at most :data:`MAX_REFS` ``$ref``s deep (a recursive one is not).
- Several of these keywords in one schema (annotations such as ``description`` dropped): the
  ``anyOf`` of their complements, as each judges the instance alone.
``if: I, then: T, else: E`` is ``anyOf: [allOf: [I, T], allOf: [not I, E]]``, served where the
complement of ``I`` is known.
Any other ``not`` is left as it is, and llguidance's refusal names the keyword. The rewrite goes
from the outside in, so a ``not`` inside a ``not`` is read before it is rewritten.
"""

from __future__ import annotations

import json
from typing import Any

from llgtriton.json_schemas import ANNOTATIONS, ONE_SCHEMA, SCHEMA_LISTS, SCHEMA_MAPS, local_target, named_values
from llgtriton.schema_values import NoExactComplement, values_complement

MAX_REFS = 8  # $refs followed within one complement
TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_BOUND_COMPLEMENTS = {
    "maximum": "exclusiveMinimum",
    "minimum": "exclusiveMaximum",
    "exclusiveMaximum": "minimum",
    "exclusiveMinimum": "maximum",
}
# Counts: the complement of "at least n" is "at most n - 1" of the same type, and the reverse.
_COUNT_COMPLEMENTS = {
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
}
# Keywords whose complement is taken one at a time when a negated schema holds several.
_INDEPENDENT = frozenset(
    {
        "type",
        "required",
        "properties",
        "const",
        "enum",
        "not",
        "anyOf",
        "allOf",
        *_BOUND_COMPLEMENTS,
        *_COUNT_COMPLEMENTS,
    }
)
_DEFINITIONS = frozenset({"definitions", "$defs"})
_READ_PROPERTIES = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties"})


def not_as_complement(schema: Any, root: Any = None) -> Any:
    """``schema`` with every ``not`` of a known form written as its complement, and every ``if`` whose
    complement is known as the two cases it chooses between; the schema is not changed. ``$ref``s
    are read in ``root`` (the whole document; ``schema`` itself when not given)."""
    if not isinstance(schema, dict):
        return schema
    root = schema if root is None else root
    node = schema
    if "not" in node:
        node = _without_not(node, root)
    if "if" in node:
        node = _without_if(node, root)
    return {key: _inside(key, value, root) for key, value in node.items()}


def _without_if(node: dict[str, Any], root: Any) -> dict[str, Any]:
    """``if: I, then: T, else: E`` is ``anyOf: [allOf: [I, T], allOf: [not I, E]]`` (a missing branch holds)."""
    rest = {key: value for key, value in node.items() if key not in ("if", "then", "else")}
    earlier = rest.get("allOf", [])
    if not isinstance(earlier, list):
        return node
    condition = node["if"]
    try:
        otherwise = complement(condition, root=root)
    except NoExactComplement:
        return node
    cases = {"anyOf": [{"allOf": [condition, node.get("then", True)]}, {"allOf": [otherwise, node.get("else", True)]}]}
    return {**rest, "allOf": [*earlier, cases]}


def _inside(key: str, value: Any, root: Any) -> Any:
    if key in SCHEMA_MAPS and isinstance(value, dict):
        return {name: not_as_complement(item, root) for name, item in value.items()}
    if key in SCHEMA_LISTS and isinstance(value, list):
        return [not_as_complement(item, root) for item in value]
    if key in ONE_SCHEMA:
        return not_as_complement(value, root)
    return value


def _without_not(node: dict[str, Any], root: Any) -> dict[str, Any]:
    rest = {key: value for key, value in node.items() if key != "not"}
    earlier = rest.get("allOf", [])
    if not isinstance(earlier, list):
        return node
    try:
        written = complement(node["not"], rest, root=root)
    except NoExactComplement:
        return node
    if written is True:
        return rest
    return {**rest, "allOf": [*earlier, written]}


def complement(negated: Any, around: dict[str, Any] | None = None, *, root: Any = None, refs: int = MAX_REFS) -> Any:
    """A schema that holds exactly where ``negated`` does not (``around``: the schema the ``not`` sits in,
    for the forms that depend on it; ``root``: the document a ``$ref`` points into, and ``refs`` the
    ``$ref``s left to follow); raises :class:`NoExactComplement`."""
    if negated is False:
        return True
    if negated is True or negated == {}:
        return False
    if not isinstance(negated, dict):
        raise NoExactComplement
    # Definitions assert nothing; a $ref into them that the rewrite drops is refused by llguidance.
    asserted = {key: value for key, value in negated.items() if key not in ANNOTATIONS | _DEFINITIONS}
    if not asserted:
        return False
    if len(asserted) > 1:
        return _split_complement(asserted, around, root, refs)
    ((keyword, value),) = asserted.items()
    if keyword == "$ref":
        target = local_target(root, value) if isinstance(value, str) and root is not None else None
        if target is None or refs <= 0:
            raise NoExactComplement
        return complement(target, around, root=root, refs=refs - 1)
    if keyword == "not":
        return value
    if keyword == "anyOf" and isinstance(value, list) and value:
        return {"allOf": [complement(branch, around, root=root, refs=refs) for branch in value]}
    if keyword == "allOf" and isinstance(value, list) and value:
        return {"anyOf": [complement(branch, around, root=root, refs=refs) for branch in value]}
    if keyword == "required":
        return _not_required(value)
    if keyword == "properties":
        return _not_properties(value, root, refs)
    if keyword == "type":
        return _not_type(value, around or {})
    if keyword in _BOUND_COMPLEMENTS and isinstance(value, int | float) and not isinstance(value, bool):
        return {"type": "number", _BOUND_COMPLEMENTS[keyword]: value}
    if keyword in _COUNT_COMPLEMENTS and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        kind, other, step = _COUNT_COMPLEMENTS[keyword]
        if value + step < 0:  # minItems: 0 always holds
            return False
        return {"type": kind, other: value + step}
    if keyword in ("const", "enum"):
        excluded = [value] if keyword == "const" else value
        if not isinstance(excluded, list):
            raise NoExactComplement
        if around is not None and ("const" in around or isinstance(around.get("enum"), list)):
            return _not_values(excluded, around)
        return values_complement(excluded)
    raise NoExactComplement


def _split_complement(asserted: dict[str, Any], around: dict[str, Any] | None, root: Any, refs: int) -> Any:
    """Keywords that each judge the instance alone are their conjunction, so the complement is the
    ``anyOf`` of theirs (De Morgan). ``properties`` is alone only without the keywords that read it."""
    if not asserted.keys() <= _INDEPENDENT or asserted.keys() & _READ_PROPERTIES:
        raise NoExactComplement
    return {"anyOf": [complement({key: value}, around, root=root, refs=refs) for key, value in asserted.items()]}


def _not_properties(declared: Any, root: Any, refs: int) -> Any:
    """``properties`` fails where the instance is an object holding one of them that fails its schema."""
    if not isinstance(declared, dict):
        raise NoExactComplement
    cases = [
        {"type": "object", "required": [name], "properties": {name: complement(schema, root=root, refs=refs)}}
        for name, schema in declared.items()
        if schema is not True and schema != {}
    ]
    if not cases:
        return False
    return cases[0] if len(cases) == 1 else {"anyOf": cases}


def _not_required(names: Any) -> Any:
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise NoExactComplement
    if not names:  # required: [] always holds
        return False
    return {"type": "object", "anyOf": [{"properties": {name: False}} for name in dict.fromkeys(names)]}


def _types(value: Any) -> set[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(name in TYPES for name in names):
        raise NoExactComplement
    return set(names)


def _not_type(value: Any, around: dict[str, Any]) -> Any:
    excluded = _types(value)
    if "number" in excluded:  # "number" holds the integers too
        excluded.add("integer")
    left = set(TYPES) - excluded
    if "integer" in excluded and "number" in left:
        # What is left holds the numbers with a fraction, which no type names: exact only where the
        # schema around allows no number anyway.
        if "number" in _types(around.get("type", list(TYPES))):
            raise NoExactComplement
        left.discard("number")
    return {"type": sorted(left)} if left else False


def _key(value: Any) -> str:
    """Equal for values JSON calls equal: 1 and 1.0 are, true and 1 are not (as the validators judge
    const and enum)."""
    return json.dumps(_canonical(value), sort_keys=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return ["number", int(value)]
    if isinstance(value, int | float):
        return ["number", value]
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    raise NoExactComplement


def _not_values(excluded: Any, around: dict[str, Any]) -> Any:
    """The ``enum`` of what ``around`` allows less ``excluded``: ``around`` must be a ``const`` or an ``enum``."""
    if not isinstance(excluded, list):
        raise NoExactComplement
    allowed = named_values(around)
    if allowed is None:
        raise NoExactComplement
    taken_out = {_key(value) for value in excluded}  # one pass each: enums may hold many thousands
    kept = [item for item in allowed if _key(item) not in taken_out]
    return {"enum": kept} if kept else False
