"""Every JSON value but a few: the exact schema of ``not: {enum: [...]}`` outside an enum.

What is left once finitely many scalars are taken out has an exact schema, one case per type:
- a type none of the values has: the whole type;
- strings: a ``pattern`` that matches every string but those (a regular language: the complement of
  a finite set, written out as a trie of the excluded words and, at each node, what leaves it);
- numbers: the open intervals between the excluded numbers (``exclusiveMinimum``/``exclusiveMaximum``);
  ``integer`` values are numbers here, as JSON Schema compares them (1 and 1.0 are equal);
- booleans: the other one, if it is not excluded too; ``null``: nothing.
An array or object among the values, or a string holding ``"`` or ``\\``, has no such schema here:
:class:`NoExactComplement`.
The pattern's size follows the excluded words' (bounded by :data:`MAX_PATTERN_CHARS`).
"""

from __future__ import annotations

import itertools
from typing import Any

# Excluded strings' characters a complement pattern may hold: a constraint is at most 1 MiB, and
# a pattern is compiled into the lexer once per schema.
MAX_PATTERN_CHARS = 4096
_ANY = r"[\s\S]"
# llguidance 1.9.1 reads a negated class over a string's JSON text: `[^"]` and `[^\\]` still let the
# escaped character through, so a word holding one cannot be taken out (checked by a test).
_UNEXCLUDABLE = frozenset('"\\')
_META = frozenset("\\.+*?()|[]{}^$-")


class NoExactComplement(Exception):
    """The schema has no complement llgtriton can write exactly."""


def values_complement(values: list[Any]) -> Any:
    """A schema holding exactly the JSON values that are none of ``values``."""
    strings: set[str] = set()
    numbers: set[int | float] = set()
    booleans: set[bool] = set()
    null = False
    for value in values:
        if isinstance(value, bool):
            booleans.add(value)
        elif value is None:
            null = True
        elif isinstance(value, str):
            strings.add(value)
        elif isinstance(value, int | float):
            numbers.add(value)
        else:
            raise NoExactComplement
    whole = [name for name, hit in (("null", null), ("boolean", booleans), ("string", strings)) if not hit]
    whole += ["array", "object"] + ([] if numbers else ["number"])
    cases: list[Any] = [{"type": sorted(whole)}]
    if strings:
        cases.append({"type": "string", "pattern": other_strings_pattern(strings)})
    cases.extend(_other_numbers(numbers))
    kept = [{"const": flag} for flag in (False, True) if booleans and flag not in booleans]
    return {"anyOf": cases + kept}


def other_strings_pattern(words: set[str]) -> str:
    """An anchored pattern matching every string that is none of ``words`` (not empty)."""
    if sum(len(word) for word in words) > MAX_PATTERN_CHARS:
        raise NoExactComplement
    if any(char in word for word in words for char in _UNEXCLUDABLE):
        raise NoExactComplement
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here
    return f"^{_other_suffixes(trie)}$"


def _other_suffixes(node: dict[str, Any]) -> str:
    """What may follow a prefix at ``node`` so the whole string is not a word."""
    children = sorted(char for char in node if char)
    cases = [] if "" in node else [""]  # stopping here is another string, unless a word ends here
    cases.extend(_escaped(char) + _other_suffixes(node[char]) for char in children)
    if children:
        cases.append(f"[^{''.join(_escaped(char) for char in children)}]{_ANY}*")
    else:
        cases.append(f"{_ANY}+")
    return cases[0] if len(cases) == 1 else "(" + "|".join(cases) + ")"


def _escaped(char: str) -> str:
    if char in _META:
        return "\\" + char
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{{{ord(char):X}}}"
    return char


def _other_numbers(numbers: set[int | float]) -> list[dict[str, Any]]:
    """The numbers between and beyond ``numbers``, as open intervals."""
    ordered = sorted(set(numbers))
    if not ordered:
        return []
    cases: list[dict[str, Any]] = [{"type": "number", "exclusiveMaximum": ordered[0]}]
    cases.extend(
        {"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": high}
        for low, high in itertools.pairwise(ordered)
    )
    cases.append({"type": "number", "exclusiveMinimum": ordered[-1]})
    return cases
