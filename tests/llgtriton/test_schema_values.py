"""Every JSON value but a few: the complement of an ``enum`` of scalars, exactly.

hypothesis-jsonschema draws strings near the excluded words (and numbers, booleans, null), the
``jsonschema`` validator judges them against ``not: {enum: ...}``, and the compiled complement must
agree both ways.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import json_schema_grammar
from llgtriton.schema_values import NoExactComplement, other_strings_pattern, values_complement
from tests.llgtriton.matching import accepts, drawn, instance_text

WORDS = ["linux", "li", "", "a-b", "[^]", "x.*", "é", "\t\n", "\x01"]
EXCLUDED: list[list[Any]] = [WORDS, ["a", 1, 2.5, True, None], [0, -3, 7.25], [False, "b"]]


@pytest.mark.parametrize("excluded", EXCLUDED, ids=str)
@settings(max_examples=100, deadline=None)
@given(
    value=drawn({"type": "string", "maxLength": 6, "pattern": "^[lineuxa\\-b\\[\\^\\].*é\\t\\n\\x01]*$"})
    | st.sampled_from([*WORDS, "lin", "linuxx", "a-", "[^]]", "x.", "x.**"])
    | st.integers(-4, 8)
    | st.sampled_from([2.5, 7.25, -3.0, 0.5, True, False, None, [], {}])
)
def test_the_complement_holds_exactly_the_other_values(excluded: list[Any], value: Any) -> None:
    grammar = json_schema_grammar(values_complement(excluded))
    expected = not any(_same(value, item) for item in excluded)
    assert accepts(grammar, instance_text(value)) == expected, value


def _same(first: Any, second: Any) -> bool:
    """JSON's equality: 1 and 1.0 are equal, true and 1 are not."""
    return isinstance(first, bool) == isinstance(second, bool) and type(first) is not list and first == second


@pytest.mark.parametrize("excluded", [[[1]], [{"a": 1}], ['say "hi"'], ["C:\\"]], ids=str)
def test_values_without_an_exact_complement_are_refused(excluded: list[Any]) -> None:
    with pytest.raises(NoExactComplement):
        values_complement(excluded)


def test_a_negated_class_cannot_take_out_a_quote_or_a_backslash() -> None:
    """Why words holding them are refused: llguidance 1.9.1 lets them through ``[^"]`` and ``[^\\\\]``.
    If an upgrade fixes it, this fails and the refusal can go."""
    for char in ('"', "\\"):
        grammar = json_schema_grammar({"type": "string", "pattern": f"^[^\\{char}]$"})
        assert accepts(grammar, instance_text(char))


def test_the_pattern_is_bounded() -> None:
    with pytest.raises(NoExactComplement):
        other_strings_pattern({"x" * 5_000})
