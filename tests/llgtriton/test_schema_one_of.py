"""``oneOf`` whose branches are provably disjoint is served exactly; any other stays a 400 naming it.

The property tests draw instances, let the ``jsonschema`` validator judge them, and check that the
compiled grammar agrees both ways. (Objects are drawn with their keys in the schemas' order, which
llguidance's grammars follow.)
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_not import not_as_complement
from llgtriton.schema_one_of import WORK_BUDGET, every_one_of_is_disjoint
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

BY_TYPE: dict[str, Any] = {
    "$defs": {"name": {"type": "string", "maxLength": 5}},
    "oneOf": [
        {"$ref": "#/$defs/name"},
        {"type": "array", "items": {"$ref": "#/$defs/name"}, "maxItems": 3},
        {"type": "null"},
    ],
}
BY_DISCRIMINATOR: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"kind": {"const": "circle"}, "r": {"type": "integer"}},
            "required": ["kind", "r"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"kind": {"enum": ["square", "rect"]}, "side": {"type": "integer"}},
            "required": ["kind", "side"],
            "additionalProperties": False,
        },
    ]
}
BY_FORBIDDEN: dict[str, Any] = {
    "type": "object",
    "properties": {
        "shape": {
            "oneOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"a": False, "b": {"type": "string"}}, "required": ["b"]},
            ]
        }
    },
    "required": ["shape"],
    "additionalProperties": False,
}

scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "ab", "abcdefg", "circle", "rect"])
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(values)
def test_branches_of_different_types_reached_through_refs(instance: Any) -> None:
    assert_grammar_agrees(BY_TYPE, instance)


@settings(max_examples=150, deadline=None)
@given(
    objects_in_order(["kind", "r", "side"], st.sampled_from(["circle", "square", "rect", "x"]) | st.integers(0, 9))
    | values
)
def test_objects_told_apart_by_a_required_discriminator(instance: Any) -> None:
    assert_grammar_agrees(BY_DISCRIMINATOR, instance)


@settings(max_examples=150, deadline=None)
@given(
    objects_in_order(["shape"], objects_in_order(["a", "b"], st.integers(0, 9) | st.sampled_from(["x", ""])) | values)
)
def test_objects_told_apart_by_a_property_one_requires_and_the_other_forbids(instance: Any) -> None:
    assert_grammar_agrees(BY_FORBIDDEN, instance)


BY_A_DECLARED_PROPERTY: dict[str, Any] = {  # one requires y as a string; the other, if y is there, an integer
    "oneOf": [
        {"type": "object", "properties": {"y": {"type": "string"}}, "required": ["y"]},
        {"type": "object", "properties": {"y": {"type": "integer"}, "z": {"type": "string"}}, "required": ["z"]},
    ]
}


@settings(max_examples=150, deadline=None)
@given(objects_in_order(["y", "z"], st.integers(0, 2) | st.sampled_from(["", "a"])) | st.integers())
def test_objects_told_apart_by_a_property_one_requires_and_the_other_declares(instance: Any) -> None:
    assert every_one_of_is_disjoint(BY_A_DECLARED_PROPERTY)
    assert_grammar_agrees(BY_A_DECLARED_PROPERTY, instance)


def test_a_property_neither_requires_tells_nothing_apart() -> None:
    """{} matches both: y is declared apart, but neither requires it."""
    branches = [{**branch, "required": []} for branch in BY_A_DECLARED_PROPERTY["oneOf"]]
    assert not every_one_of_is_disjoint({"oneOf": branches})


BY_PATTERNS: dict[str, Any] = {  # strings no two patterns find both (their automata, side by side)
    "type": "string",
    "oneOf": [
        {"pattern": "^[0-9]+s$"},
        {"pattern": "^[0-9]+ms$"},
        {"pattern": "^(?:(?:>=|<)[0-9]+\\.[0-9]+\\s*)+$"},
        {"enum": ["any", ""]},  # named values, none of which another branch finds
    ],
}
BY_COMPLEMENT: dict[str, Any] = {  # named values, and a branch of every other value (not judged alone)
    "$defs": {"kinds": {"enum": ["Float", "Text", 3]}, "others": {"not": {"$ref": "#/$defs/kinds"}}},
    "oneOf": [{"$ref": "#/$defs/kinds"}, {"$ref": "#/$defs/others"}],
}
pattern_text = st.text(alphabet="0129ms<>=. ", max_size=8) | st.sampled_from(["12s", "3ms", ">=1.5 <2.0", "any", ""])


@settings(max_examples=200, deadline=None)
@given(pattern_text)
def test_strings_told_apart_by_patterns_no_string_matches_twice(instance: str) -> None:
    assert every_one_of_is_disjoint(BY_PATTERNS)
    assert_grammar_agrees(BY_PATTERNS, instance)


@settings(max_examples=150, deadline=None)
@given(values | st.sampled_from(["Float", "Text", "Floa", "Texts", 3, 3.5]))
def test_named_values_apart_from_a_branch_of_every_other_value(instance: Any) -> None:
    assert every_one_of_is_disjoint(not_as_complement(BY_COMPLEMENT))  # as the compile reads it
    assert_grammar_agrees(BY_COMPLEMENT, instance)


MAY_OVERLAP = [
    [{"type": "string"}, {"type": "string", "maxLength": 3}],  # "ab" matches both
    [{"required": ["a"]}, {"required": ["b"]}],  # {"a": 1, "b": 2} matches both; a string matches both
    [  # a discriminator, but a string matches both: nothing says they are objects
        {"properties": {"k": {"const": 1}}, "required": ["k"]},
        {"properties": {"k": {"const": 2}}, "required": ["k"]},
    ],
]


@pytest.mark.parametrize("branches", MAY_OVERLAP, ids=str)
def test_branches_that_may_overlap_are_not_proven_disjoint(branches: list[Any]) -> None:
    """(They are served as exact cases: ``tests/llgtriton/test_schema_one_of_cases.py``.)"""
    assert not every_one_of_is_disjoint({"oneOf": branches})


@pytest.mark.parametrize(
    ("branches", "keys"), list(zip(MAY_OVERLAP, [["a"], ["a", "b", "c"], ["k", "c"]], strict=True))
)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_branches_that_may_overlap_are_served_as_exact_cases(branches: list[Any], keys: list[str], data: Any) -> None:
    """Objects with the keys the branches name first: llguidance writes declared properties before others."""
    instance = data.draw(objects_in_order(keys, st.integers(0, 2)) | st.sampled_from(["", "abcd", 1, None]))
    assert_grammar_agrees({"oneOf": branches}, instance)


@pytest.mark.parametrize(
    "branches",
    [
        [{"type": "integer"}, {"type": "number"}],  # 1 matches both; no schema says "not an integer"
        [{"$ref": "#/$defs/missing"}, {"type": "null"}],  # a branch that cannot be read proves nothing
        [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}],  # "ab" matches both
        [{"type": "string", "pattern": "^\\d$"}, {"type": "string", "pattern": "^\\s$"}],  # categories: not shown apart
        [{"type": "string", "pattern": "^(?=a)"}, {"type": "string", "pattern": "^b"}],  # a lookahead is not read
        [{"type": "string", "pattern": "^a$"}, {"type": "string", "pattern": "^a\\n"}],  # "a\n": $ before a newline
    ],
)
def test_branches_that_may_overlap_without_a_complement_stay_refused_naming_one_of(branches: list[Any]) -> None:
    schema = {"oneOf": branches, "$defs": {}}
    assert not every_one_of_is_disjoint(schema)
    with pytest.raises(GuideError, match=r"oneOf|missing"):  # (the last one: its $ref is named first)
        check_grammar(json_schema_grammar(schema))


def test_one_overlapping_one_of_keeps_the_whole_schema_refused() -> None:
    schema = {
        "type": "object",
        "properties": {
            "x": {"oneOf": [{"type": "string"}, {"type": "null"}]},
            "y": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
        },
    }
    assert not every_one_of_is_disjoint(schema)
    with pytest.raises(GuideError, match="oneOf"):
        check_grammar(json_schema_grammar(schema))


def discriminated(branches: int) -> dict[str, Any]:
    """A oneOf of ``branches`` objects, each told apart by its own value of a required property."""
    return {
        "oneOf": [
            {"type": "object", "properties": {"k": {"const": index}}, "required": ["k"]} for index in range(branches)
        ]
    }


def test_a_oneof_too_large_to_prove_within_the_budget_stays_refused() -> None:
    """Thousands of disjoint branches fit in a constraint's megabyte; comparing them pairwise held a
    compile thread for a minute (3,000 branches). Past the work budget nothing is proven."""
    assert every_one_of_is_disjoint(discriminated(100))
    assert not every_one_of_is_disjoint(discriminated(3000))
    with pytest.raises(GuideError, match="oneOf"):
        check_grammar(json_schema_grammar(discriminated(3000)))


def test_a_long_enum_is_not_written_out_past_the_budget() -> None:
    """Disjoint (no kind is -1), but proving it would write out more values than the budget allows."""
    kinds: dict[str, Any] = {"enum": list(range(WORK_BUDGET + 1))}
    schema = {
        "$defs": {"kinds": kinds},
        "oneOf": [
            {"type": "object", "properties": {"k": {"$ref": "#/$defs/kinds"}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"const": -1}}, "required": ["k"]},
        ],
    }
    assert not every_one_of_is_disjoint(schema)
    kinds["enum"] = list(range(100))
    assert every_one_of_is_disjoint(schema)
