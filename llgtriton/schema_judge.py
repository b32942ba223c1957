"""Judging one concrete value by a simple schema, and what an anchored pattern's strings start with:
the facts the ``oneOf`` proof (:mod:`llgtriton.schema_one_of`) reads off its branches.

:func:`satisfies` judges only the keywords of :data:`JUDGED` (a schema with any other is not
judged alone) as the ``jsonschema`` validator does: ``pattern`` with Python's ``re.search``, lengths
in code points, 1 and 1.0 equal, ``true`` and 1 not. Python's ``re`` backtracks, so the proof pays
for each search out of its bounded budget: a :class:`PatternSearch` runs a pattern that is regular
(:mod:`llgtriton.schema_regex`) as an automaton and pays the steps it takes; any other is searched
with ``re`` and paid at :func:`search_cost`, a bound on backtracking, before it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from llgtriton.json_schemas import ANNOTATIONS
from llgtriton.schema_regex import TooCostly, compile_work, search

MAX_SEARCH_STEPS = 50_000  # one search's steps, past which it stops (TooCostly) and proves nothing

JUDGED = frozenset(
    {
        "type",
        "const",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
# Every keyword of JSON Schema's drafts 3 to 2020-12. A validator ignores any other key (a
# project's own, such as ``standsFor`` or ``x-taplo``), so a schema may hold those and still be judged.
KEYWORDS = frozenset(
    {
        *JUDGED,
        *ANNOTATIONS,
        *("$schema", "$id", "id", "$ref", "$dynamicRef", "$recursiveRef", "$anchor", "$dynamicAnchor"),
        *("$recursiveAnchor", "$vocabulary", "$defs", "definitions", "allOf", "anyOf", "oneOf", "not", "if"),
        *("then", "else", "dependentSchemas", "dependencies", "dependentRequired", "prefixItems", "items"),
        *("additionalItems", "contains", "minContains", "maxContains", "uniqueItems", "minItems", "maxItems"),
        *("properties", "patternProperties", "additionalProperties", "propertyNames", "required"),
        *("minProperties", "maxProperties", "unevaluatedItems", "unevaluatedProperties", "multipleOf"),
        *("format", "contentEncoding", "contentMediaType", "contentSchema", "disallow", "extends", "divisibleBy"),
    }
)
_QUANTIFIERS = re.compile(r"[*+?{]")
_PATTERN_META = frozenset(".[](){}*+?|^$")


def judged_alone(schema: Any) -> bool:
    """Whether :func:`satisfies` can judge a value by ``schema``."""
    if not isinstance(schema, dict):
        return False
    return all(key in JUDGED or key in ANNOTATIONS or key not in KEYWORDS for key in schema) and _judgeable_bounds(
        schema
    )


def search_cost(value: Any, schema: dict[str, Any]) -> int:
    """An upper bound on the steps :func:`satisfies` takes (a backtracking search of ``pattern``)."""
    pattern = schema.get("pattern")
    if not isinstance(pattern, str) or not isinstance(value, str):
        return 1
    steps: int = (len(value) + 1) ** max(1, len(_QUANTIFIERS.findall(pattern)))
    return steps + len(pattern)


class PatternSearch:
    """``re.search`` with its steps paid by ``spend``, each search at most :data:`MAX_SEARCH_STEPS`
    (past which it raises :class:`TooCostly`); a pattern's automaton is paid for once."""

    def __init__(self, spend: Callable[[int], None]) -> None:
        self._spend = spend
        self._paid: set[str] = set()

    def found(self, pattern: str, text: str) -> bool:
        """Whether ``re.search(pattern, text)`` finds a match; raises ``re.error`` for a pattern
        ``re`` does not compile."""
        program, work = compile_work(pattern)
        if pattern not in self._paid:
            self._spend(work)
            self._paid.add(pattern)
        if program is None:
            cost = search_cost(text, {"pattern": pattern})
            if cost > MAX_SEARCH_STEPS:
                raise TooCostly from None
            self._spend(cost)
            return re.search(pattern, text) is not None
        return search(program, text, self.capped())

    def capped(self) -> Callable[[int], None]:
        """``spend``, raising :class:`TooCostly` once one search has spent :data:`MAX_SEARCH_STEPS`."""
        spent = 0

        def spend(steps: int) -> None:
            nonlocal spent
            spent += steps
            if spent > MAX_SEARCH_STEPS:
                raise TooCostly
            self._spend(steps)

        return spend


def satisfies(value: Any, schema: dict[str, Any], searcher: PatternSearch | None = None) -> bool:
    """Whether ``value`` is valid against ``schema`` (:func:`judged_alone` must hold); True when unsure.
    A ``pattern`` is searched by ``searcher`` (or, without one, by ``re``: the caller has paid
    :func:`search_cost`)."""
    declared = schema.get("type")
    if declared is not None:
        names = [declared] if isinstance(declared, str) else declared
        if not isinstance(names, list) or not any(_is_type(value, name) for name in names):
            return not isinstance(names, list)
    if "const" in schema and not _equal(value, schema["const"]):
        return False
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(_equal(value, item) for item in enum):
        return False
    if isinstance(value, str):
        return _string_satisfies(value, schema, searcher)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number_satisfies(value, schema)
    return True


def literal_prefix(pattern: Any) -> str | None:
    """What every string ``pattern`` finds starts with: the literal characters after a leading ``^``
    (none for a pattern with ``|``, which may hold another branch)."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or "|" in pattern:
        return None
    chars: list[str] = []
    index = 1
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            if index + 1 >= len(pattern) or pattern[index + 1].isalnum():
                break  # a class (\d, \w ...) or an escape that is not one character
            literal, step = pattern[index + 1], 2
        elif char in _PATTERN_META:
            break
        else:
            literal, step = char, 1
        if pattern[index + step : index + step + 1] in ("?", "*", "{"):
            break  # this character may be missing (or repeated where the next one is expected)
        chars.append(literal)
        index += step
    return "".join(chars) or None


def literal_suffix(pattern: Any) -> str | None:
    """What every string ``pattern`` finds ends with, a final newline aside (Python's ``$`` also
    matches before one): the literal characters before a final ``$``. None for a pattern with ``|``
    or an inline flag (``(?i)`` would make the literal match other cases), and where the suffix holds
    a newline."""
    if not isinstance(pattern, str) or not pattern.endswith("$") or "|" in pattern or "(?" in pattern:
        return None
    tokens = _tokens(pattern[:-1])
    if tokens is None:
        return None
    chars: list[str] = []
    for token in reversed(tokens):
        if len(token) == 1 and token not in _PATTERN_META:
            literal = token
        elif len(token) == 2 and token[0] == "\\" and not token[1].isalnum():
            literal = token[1]
        else:
            break
        if literal == "\n":
            break
        chars.append(literal)
    return "".join(reversed(chars)) or None


def _tokens(pattern: str) -> list[str] | None:
    """``pattern`` cut into atoms: an escape, a class, or one character (quantifiers on their own);
    None where it cannot be cut (an unclosed class, a trailing backslash)."""
    tokens: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            if index + 1 >= len(pattern):
                return None
            tokens.append(pattern[index : index + 2])
            index += 2
        elif char == "[":
            end = index + 1
            end += pattern[end : end + 1] == "^"
            end += pattern[end : end + 1] == "]"  # a ] first in a class is a literal
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            if end >= len(pattern):
                return None
            tokens.append(pattern[index : end + 1])
            index = end + 1
        else:
            tokens.append(char)
            index += 1
    return tokens


def _judgeable_bounds(schema: dict[str, Any]) -> bool:
    numbers = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    lengths = ("minLength", "maxLength")
    return all(_is_type(schema[key], "number") for key in numbers if key in schema) and all(
        _is_type(schema[key], "integer") for key in lengths if key in schema
    )


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    kinds: dict[str, Any] = {"string": str, "array": list, "object": dict, "boolean": bool, "null": type(None)}
    return name in kinds and isinstance(value, kinds[name])


def _equal(first: Any, second: Any) -> bool:
    if isinstance(first, bool) or isinstance(second, bool):
        return isinstance(first, bool) and isinstance(second, bool) and first == second
    if isinstance(first, list) and isinstance(second, list):
        return len(first) == len(second) and all(_equal(a, b) for a, b in zip(first, second, strict=True))
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(_equal(first[key], second[key]) for key in first)
    numbers = _is_type(first, "number") and _is_type(second, "number")
    return (numbers or type(first) is type(second)) and first == second


def _string_satisfies(value: str, schema: dict[str, Any], searcher: PatternSearch | None) -> bool:
    if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
        return False
    pattern = schema.get("pattern")
    if not isinstance(pattern, str):
        return True
    try:
        if searcher is not None:
            return searcher.found(pattern, value)
        return re.search(pattern, value) is not None
    except re.error:
        return True


def _number_satisfies(value: float, schema: dict[str, Any]) -> bool:
    return not (
        ("minimum" in schema and value < schema["minimum"])
        or ("maximum" in schema and value > schema["maximum"])
        or ("exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"])
        or ("exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"])
    )
