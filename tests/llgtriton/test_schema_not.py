"""``not`` and ``if`` served exactly where the complement they need has an exact form, refused (naming them)
elsewhere.

The property tests draw instances of every JSON type, let the ``jsonschema`` validator judge them,
and check that the compiled grammar agrees both ways.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_not import not_as_complement
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

scalars = (
    st.integers(-3, 3)
    | st.sampled_from([0.5, -2.25])  # (1.0: llguidance writes integers without a fraction)
    | st.sampled_from(["a", "b", ""])
    | st.booleans()
    | st.none()
)
values = scalars | st.lists(scalars, max_size=2) | st.dictionaries(st.sampled_from(["k"]), scalars, max_size=1)

NOT_REQUIRED: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}},
    "not": {"required": ["a", "b"]},
}
NOT_TYPES = [
    {"not": {"type": "string"}},
    {"not": {"type": ["object", "null", "number"]}},
    {"type": ["integer", "string", "boolean"], "not": {"type": "integer"}},
    {"type": ["number", "string"], "not": {"type": "number"}},
    {"not": {"required": ["k"]}},
    {"anyOf": [{"type": "string"}, {"type": "integer", "not": {}}]},
    {"type": "array", "items": {"not": {"type": ["array", "object"]}}},
    {"not": {"maximum": 1}},
    {"not": {"exclusiveMinimum": -0.5}},
    {"type": ["number", "string"], "not": {"not": {"minimum": 0}}},
    {"not": {"anyOf": [{"required": ["k"]}, {"type": "string"}]}},
    {"not": {"anyOf": [{"type": "string"}, {"minimum": 2}]}},  # the numbers below 2
    {"not": {"allOf": [{"type": "array"}, {"not": {"type": "null"}}]}},
    {"not": {"not": {"not": {"type": "boolean"}}}},
    {"not": {"minItems": 1}},
    {"not": {"allOf": [{"maxItems": 0}, {"maxLength": 0}]}},  # a non-empty array or string
    {"if": {"maximum": 1}, "then": {"type": "integer"}, "else": {"type": "string"}},
    {"if": {"minItems": 1}, "then": {"items": {"type": "string"}}},
    {"if": {"type": "object"}, "then": {"required": ["k"]}, "else": {"not": {"type": "null"}}},
    {"not": {"type": "string", "minLength": 2, "description": "several keywords: anyOf of complements"}},
    {"not": {"properties": {"k": {"type": "string"}}}},  # an object whose k is not a string
    {"if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["k"]}, "else": {"type": "object"}},
    {"not": {"definitions": {"x": {}}, "not": {"type": "array"}}},  # definitions assert nothing
]
NOT_VALUES = [
    {"type": "string", "not": {"enum": ["a", "ab", "", "b\n"]}},  # every string but these
    {"not": {"enum": ["a", 1, 2.25, None, False]}},
    {"not": {"const": True}},
    {"enum": ["a", "b", 1, 2.25, None, True], "not": {"enum": ["a", 1.0, False]}},
    {"enum": [1, "b"], "not": {"const": 1}},
    {"const": "a", "not": {"const": "b"}},
]


@settings(max_examples=200, deadline=None)
@given(objects_in_order(["a", "b", "c"], scalars) | values)
def test_not_required_is_an_object_lacking_one_of_them(instance: Any) -> None:
    assert_grammar_agrees(NOT_REQUIRED, instance)


@pytest.mark.parametrize("schema", NOT_TYPES, ids=str)
@settings(max_examples=150, deadline=None)
@given(instance=values)
def test_not_type_bounds_and_their_combinations(schema: dict[str, Any], instance: Any) -> None:
    assert_grammar_agrees(schema, instance)


@pytest.mark.parametrize("schema", NOT_VALUES, ids=str)
@settings(max_examples=60, deadline=None)
@given(instance=st.sampled_from(["a", "b", "ab", "", "b\n", "ba", 1, 1.0, 2.25, 3, None, True, False, 0]) | values)
def test_not_const_or_enum_takes_values_out_of_an_enum(schema: dict[str, Any], instance: Any) -> None:
    assert_grammar_agrees(schema, instance)


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {"type": "integer"}},  # the numbers with a fraction: no exact form
        {"not": {"enum": [[1]]}},  # every value but an array
        {"type": "string", "not": {"const": 'a"b'}},  # llguidance cannot take a quote out of a class
        {"not": {"type": "string", "pattern": "^a"}},
        {"not": {"properties": {"a": {"pattern": "^a"}}}},
        {"not": {"pattern": "^a"}},
        {"not": {"anyOf": [{"type": "string"}, {"pattern": "^a"}]}},  # one branch without a complement
        {"if": {"pattern": "^a"}, "then": {"maxLength": 3}},  # an if without a complement
    ],
    ids=str,
)
def test_a_not_or_if_without_an_exact_complement_is_refused_naming_it(schema: dict[str, Any]) -> None:
    with pytest.raises(GuideError, match="not" if "not" in schema else "if"):
        check_grammar(json_schema_grammar(schema))


def test_the_rewrite_leaves_the_callers_schema_alone() -> None:
    rewritten = not_as_complement(NOT_REQUIRED)
    assert "not" in NOT_REQUIRED and "not" not in rewritten
    assert rewritten["properties"] == NOT_REQUIRED["properties"]


def test_a_large_enum_less_a_large_enum_compiles_in_one_pass_each() -> None:
    """An attacker's 1 MiB constraint: 50,000 values less 25,000 of them (pairwise, 1.25e9 comparisons)."""
    values = [f"v{index}" for index in range(50_000)]
    rewritten = not_as_complement({"enum": values, "not": {"enum": values[::2]}})
    assert rewritten["allOf"] == [{"enum": values[1::2]}]
