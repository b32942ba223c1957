"""Patterns as automata: the search answers as ``re.search`` does, its steps counted; two patterns are
proven apart only where no string is found by both."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.schema_regex import TooCostly, Unsupported, compiled, disjoint, search

_ATOMS = ["a", "b", "1", "\\n", ".", "[ab]", "[^a]", "[0-9]", "\\d", "\\s", "\\S", "\\w", "\\.", "[a-c1]"]
_ANCHORS = ["^", "$", "\\A", "\\Z"]
_ALPHABET = "ab1\n. "


def _patterns() -> st.SearchStrategy[str]:
    leaves = st.sampled_from(_ATOMS + _ANCHORS)

    def grown(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(inner, min_size=1, max_size=3).map("".join),
            st.tuples(inner, inner).map(lambda pair: f"(?:{pair[0]}|{pair[1]})"),
            inner.map(lambda item: f"({item})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{1,2}", "{0,3}", "*?", "+?", "{2,}"])).map(
                lambda pair: f"(?:{pair[0]}){pair[1]}"
            ),
        )

    return st.recursive(leaves, grown, max_leaves=8)


def _free(steps: int) -> None:
    pass


@settings(max_examples=400, deadline=None)
@given(pattern=_patterns(), text=st.text(alphabet=_ALPHABET, max_size=6))
def test_the_search_answers_as_re_does(pattern: str, text: str) -> None:
    assert search(compiled(pattern), text, _free) == (re.search(pattern, text) is not None)


_STRINGS = ["".join(chars) for size in range(5) for chars in itertools.product("ab1\n", repeat=size)]


@settings(max_examples=300, deadline=None)
@given(first=_patterns(), second=_patterns())
def test_patterns_proven_apart_share_no_string(first: str, second: str) -> None:
    if disjoint(compiled(first), compiled(second), _free):
        both = [text for text in _STRINGS if re.search(first, text) and re.search(second, text)]
        assert not both, both


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("^[0-9]+s$", "^[0-9]+ms$"),  # the class before the same suffix differs
        ("^\\d+\\.\\d+\\.\\d+(?:[+-]\\S+)?$", "^(?:(?:>=|>|<=|<)\\d+\\.\\d+\\.\\d+(?:[+-]\\S+)?\\s*)+$"),
        ("^\\^\\d+$", "^\\d+$"),
        ("^a$", "^a\\n\\n"),  # $ allows one final newline, not two
        ("^[a-z]+$", "^[A-Z]+$"),
    ],
)
def test_patterns_apart(first: str, second: str) -> None:
    assert disjoint(compiled(first), compiled(second), _free)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("^a", "b$"),  # "ab"
        ("^a$", "^a\\n"),  # "a\n": $ matches before a final newline
        ("^\\d+$", "^[0-9]+$"),
        ("\\d", "\\w"),  # two categories: not shown apart
        ("\\n", "^$"),  # "\n"
        ("^", "^b"),
    ],
)
def test_patterns_not_proven_apart(first: str, second: str) -> None:
    assert not disjoint(compiled(first), compiled(second), _free)


@pytest.mark.parametrize(
    "pattern",
    ["(?=a)b", "(?!a)", "(?<=a)b", "(a)\\1", "\\bword", "(?i)a", "(?m)^a$", "a(?i:b)", "a*+", "(?>a*)", "(?s).", "["],
)
def test_what_is_read_only_by_re_is_unsupported(pattern: str) -> None:
    with pytest.raises(Unsupported):
        compiled(pattern)


def test_a_search_costs_at_most_the_program_per_character() -> None:
    spent = 0

    def spend(steps: int) -> None:
        nonlocal spent
        spent += steps

    program = compiled("(a*)*b")  # exponential for a backtracking engine
    text = "a" * 1000
    assert not search(program, text, spend)
    assert spent <= (len(text) + 1) * 2 * (len(program) + 2)


def test_a_search_stops_where_its_budget_does() -> None:
    def spend(steps: int) -> None:
        raise TooCostly

    with pytest.raises(TooCostly):
        search(compiled("a+b"), "aaa", spend)
