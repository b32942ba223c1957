"""``not`` within finitely many values: the values it keeps, judged one by one.

Where a schema (or one of its ``allOf`` entries, which must all hold) is a ``const`` or an ``enum``
``V``, or a ``type: integer`` between two bounds (at most :data:`MAX_INTEGERS` of them; ``V``: that
run of integers, which ``jsonschema`` finds equal to ``3.0`` as to ``3``), an instance is one of
``V``; a ``not: N`` in that schema, or in another of its ``allOf`` entries, then holds exactly for
the values of ``V`` that ``N`` rejects, so it becomes ``enum: [v in V that N rejects]`` (``false``
when there are none). That is exact wherever ``N`` can be judged: :func:`holds` judges objects and
arrays too (``properties``, ``patternProperties``, ``additionalProperties``, ``items`` ...) and
``multipleOf`` (as ``jsonschema`` computes it), which :mod:`llgtriton.schema_not` has no complement
for. A ``not`` whose ``N`` holds a keyword :func:`holds` does not know (``$ref``, ``format`` ...) is
left as it is, and llguidance's refusal names it. This runs before :mod:`llgtriton.schema_not`
writes complements: a ``not`` among named values is always written out exactly here, where its
complement (``not: {not: {patternProperties}}`` is the ``patternProperties``) may not compile.

Patterns are searched as :mod:`llgtriton.schema_judge` does (``re.search``'s answer, its steps
counted); the judging spends a bounded budget (:data:`MAX_STEPS`), past which the ``not`` is left
as it is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from llgtriton.json_schemas import ANNOTATIONS, named_values, rewritten
from llgtriton.schema_judge import JUDGED, KEYWORDS, PatternSearch, judged_alone, satisfies
from llgtriton.schema_regex import TooCostly
from llgtriton.schema_values import NoExactComplement

# Values judged times the steps of each: a schema is rewritten once per compile.
MAX_STEPS = 100_000
MAX_INTEGERS = 1_000  # a run of integers read as values (each written out again where a not keeps it)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BOOLEAN_EXCLUSIVE_DRAFTS = ("draft-03/", "draft-04/")
_TYPE_NAMES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_OBJECT = frozenset(
    {"properties", "patternProperties", "additionalProperties", "required", "minProperties", "maxProperties"}
)
_ARRAY = frozenset({"items", "minItems", "maxItems"})
_NUMBER = frozenset({"multipleOf"})
_LOGIC = frozenset({"allOf", "anyOf", "oneOf", "not"})
# Keywords that assert nothing here (definitions are read only through a $ref, which is refused).
_INERT = ANNOTATIONS | {"$defs", "definitions", "$schema"}
_KNOWN = JUDGED | _OBJECT | _ARRAY | _NUMBER | _LOGIC | _INERT


class Budget:
    """The judging steps left to one rewrite (each also paid to ``outer``, where given)."""

    def __init__(self, steps: int = MAX_STEPS, outer: Callable[[int], None] | None = None) -> None:
        self._left = steps
        self._outer = outer
        self.searcher = PatternSearch(self.spend)

    def spend(self, steps: int) -> None:
        if self._outer is not None:
            self._outer(steps)
        self._left -= steps
        if self._left < 0:
            raise NoExactComplement


def not_within_values(schema: Any) -> Any:
    """``schema`` with every ``not`` that sits among named values written as the values it keeps;
    the schema is not changed."""
    budget = Budget()
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    old = isinstance(uri, str) and any(draft in uri for draft in _BOOLEAN_EXCLUSIVE_DRAFTS)
    return rewritten(schema, lambda node: _within(node, budget, old))


def _within(node: dict[str, Any], budget: Budget, old: bool) -> dict[str, Any]:
    earlier = node.get("allOf", [])
    if not isinstance(earlier, list):
        return node
    if "not" not in node and not any(isinstance(entry, dict) and "not" in entry for entry in earlier):
        return node  # nothing to write out (and no run of integers to spell)
    named = [values for values in (_finite(entry, old) for entry in (node, *earlier)) if values is not None]
    if not named:
        return node
    values = min(named, key=len)  # any one of them bounds the instance: the fewest judge fastest
    entries = [_kept(entry, values, budget) if isinstance(entry, dict) else entry for entry in earlier]
    return _kept({**node, "allOf": entries} if entries else node, values, budget)


def _finite(schema: Any, old: bool) -> list[Any] | None:
    """The values ``schema`` allows, where it names them or they are a short run of integers
    (``type: integer`` between two bounds): an instance it accepts is one of them (of the integers,
    more where a bound is read as inclusive: in drafts 3 and 4, ``exclusiveMinimum: true`` makes
    ``minimum`` exclusive, and ``exclusiveMinimum`` is no bound of its own, so there it is not read)."""
    named = named_values(schema)
    if named is not None or not isinstance(schema, dict) or schema.get("type") not in ("integer", ["integer"]):
        return named
    bounds = {key: schema[key] for key in _BOUNDS if key in schema and not (old and key.startswith("exclusive"))}
    if not all(isinstance(bound, int | float) and not isinstance(bound, bool) for bound in bounds.values()):
        return None
    lows = [math.ceil(bounds["minimum"])] if "minimum" in bounds else []
    lows += [math.floor(bounds["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in bounds else []
    highs = [math.floor(bounds["maximum"])] if "maximum" in bounds else []
    highs += [math.ceil(bounds["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in bounds else []
    if not lows or not highs or min(highs) - max(lows) >= MAX_INTEGERS:
        return None
    return list(range(max(lows), min(highs) + 1))


def _kept(node: dict[str, Any], values: list[Any], budget: Budget) -> dict[str, Any]:
    """``node`` with its ``not`` written as the ``values`` it rejects, where it can be judged."""
    if "not" not in node or not isinstance(node.get("allOf", []), list):
        return node
    try:
        kept = [value for value in values if not holds(value, node["not"], budget)]
    except (NoExactComplement, TooCostly, RecursionError):
        return node
    rest = {key: value for key, value in node.items() if key != "not"}
    return {**rest, "allOf": [*rest.get("allOf", []), {"enum": kept} if kept else False]}


def holds(value: Any, schema: Any, budget: Budget) -> bool:
    """Whether ``value`` is valid against ``schema``, as the ``jsonschema`` validator judges it;
    raises :class:`NoExactComplement` where a keyword is not known here. A value one keyword
    rejects is invalid whatever the others say, so the judging stops there."""
    budget.spend(1)
    if isinstance(schema, bool):
        return schema
    # A key no draft defines (a project's own) is ignored by the validator, and here.
    if not isinstance(schema, dict) or any(key in KEYWORDS and key not in _KNOWN for key in schema):
        raise NoExactComplement
    if not _scalar_holds(value, {key: item for key, item in schema.items() if key in JUDGED}, budget):
        return False
    if "multipleOf" in schema and not _multiple_holds(value, schema["multipleOf"]):
        return False
    if isinstance(value, dict) and not _object_holds(value, schema, budget):
        return False
    if isinstance(value, list) and not _array_holds(value, schema, budget):
        return False
    return _logic_holds(value, schema, budget)


def _scalar_holds(value: Any, scalar: dict[str, Any], budget: Budget) -> bool:
    # satisfies() answers True where unsure: check first that it cannot be.
    declared = scalar.get("type")
    if declared is not None:
        names = [declared] if isinstance(declared, str) else declared
        if not isinstance(names, list) or not all(isinstance(name, str) and name in _TYPE_NAMES for name in names):
            raise NoExactComplement
    if "enum" in scalar and not isinstance(scalar["enum"], list):
        raise NoExactComplement
    pattern = scalar.get("pattern")
    if pattern is not None:
        _compiled(pattern)
    if not judged_alone(scalar):
        raise NoExactComplement
    return satisfies(value, scalar, budget.searcher)


def _multiple_holds(value: Any, divisor: Any) -> bool:
    """``multipleOf`` as ``jsonschema`` 4.26 judges it: a float divisor by the quotient's being whole
    (exactly, by fractions, where the quotient overflows), an integer one by the remainder."""
    if not isinstance(divisor, int | float) or isinstance(divisor, bool) or not divisor > 0:
        raise NoExactComplement
    if not isinstance(value, int | float) or isinstance(value, bool):
        return True
    try:
        if isinstance(divisor, float):
            quotient = value / divisor
            try:
                failed = int(quotient) != quotient
            except OverflowError:
                failed = (Fraction(value) / Fraction(divisor)).denominator != 1
        else:
            failed = bool(value % divisor)
    except (OverflowError, ValueError):  # an integer too large for a float: the validator fails too
        raise NoExactComplement from None
    return not failed


def _compiled(pattern: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise NoExactComplement
    try:
        return re.compile(pattern)
    except re.error:
        raise NoExactComplement from None


def _count(schema: dict[str, Any], key: str, default: int) -> int:
    bound = schema.get(key, default)
    if not isinstance(bound, int) or isinstance(bound, bool):
        raise NoExactComplement
    return bound


def _object_holds(value: dict[str, Any], schema: dict[str, Any], budget: Budget) -> bool:
    declared = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    required = schema.get("required", [])
    if not isinstance(declared, dict) or not isinstance(patterns, dict) or not isinstance(required, list):
        raise NoExactComplement
    if not _count(schema, "minProperties", 0) <= len(value) <= _count(schema, "maxProperties", len(value)):
        return False
    if not all(isinstance(name, str) for name in required) or not set(required) <= value.keys():
        return False
    compiled = {pattern: _compiled(pattern) for pattern in patterns}
    for key, item in value.items():
        matched = [pattern for pattern in patterns if _found(compiled[pattern], key, budget)]
        schemas = [declared[key]] if key in declared else []
        schemas += [patterns[pattern] for pattern in matched]
        if key not in declared and not matched:
            schemas.append(schema.get("additionalProperties", True))
        if not all(holds(item, inner, budget) for inner in schemas):
            return False
    return True


def _found(pattern: re.Pattern[str], key: str, budget: Budget) -> bool:
    return budget.searcher.found(pattern.pattern, key)


def _array_holds(value: list[Any], schema: dict[str, Any], budget: Budget) -> bool:
    items = schema.get("items", True)
    if not isinstance(items, dict | bool):  # a draft-04 tuple: not judged here
        raise NoExactComplement
    if not _count(schema, "minItems", 0) <= len(value) <= _count(schema, "maxItems", len(value)):
        return False
    return all(holds(item, items, budget) for item in value)


def _logic_holds(value: Any, schema: dict[str, Any], budget: Budget) -> bool:
    lists = {key: schema[key] for key in ("allOf", "anyOf", "oneOf") if key in schema}
    if not all(isinstance(branches, list) and branches for branches in lists.values()):
        raise NoExactComplement
    judged = {key: [holds(value, branch, budget) for branch in branches] for key, branches in lists.items()}
    if "allOf" in judged and not all(judged["allOf"]):
        return False
    if "anyOf" in judged and not any(judged["anyOf"]):
        return False
    if "oneOf" in judged and sum(judged["oneOf"]) != 1:
        return False
    return not ("not" in schema and holds(value, schema["not"], budget))
