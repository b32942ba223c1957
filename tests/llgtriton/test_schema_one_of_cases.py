"""``oneOf`` whose branches may overlap, served as ``anyOf`` cases where every complement it needs is exact.

hypothesis-jsonschema draws instances of the branches (some match one, some several, some none),
the ``jsonschema`` validator judges them against the ``oneOf``, and the compiled grammar must agree
both ways. Objects are drawn with plain hypothesis strategies, keys in the schema's order (which
llguidance's grammars follow): hypothesis-jsonschema 0.23.1 cannot draw objects with the locked
hypothesis (it calls a private helper that hypothesis has since changed).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_one_of import every_one_of_is_disjoint
from llgtriton.schema_one_of_cases import one_of_as_cases
from tests.llgtriton.matching import assert_grammar_agrees, drawn, objects_in_order

SMALL = {"type": "integer", "minimum": 0, "maximum": 3}
OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {"a": SMALL, "b": SMALL, "c": SMALL},
    "additionalProperties": False,
}
REQUIRED_ONLY: dict[str, Any] = {**OBJECT, "oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["c"]}]}
REQUIRED_PAIRS: dict[str, Any] = {**OBJECT, "oneOf": [{"required": ["a", "b"]}, {"required": ["b", "c"]}]}


@pytest.mark.parametrize("schema", [REQUIRED_ONLY, REQUIRED_PAIRS], ids=["one each", "pairs"])
@settings(max_examples=80, deadline=None)
@given(instance=objects_in_order(["a", "b", "c"], st.integers(0, 3)) | drawn({"type": ["integer", "null"]}))
def test_required_branches_are_an_object_with_exactly_one_of_them(schema: dict[str, Any], instance: Any) -> None:
    assert_grammar_agrees(schema, instance)


# Numbers Python writes without an exponent: llguidance 1.9.1 reads a bounded number in plain notation only.
NUMBERS = st.integers(-8, 8) | st.sampled_from([0.5, -2.25, 4.75, 5.5])
SCALAR_BRANCHES = [
    {"oneOf": [{"enum": ["linux", "osx"]}, {"type": "string", "maxLength": 6}]},  # every short string but two
    {"oneOf": [{"enum": [[1], [3, 4], [5]]}, {"enum": [[1], [1, 2]]}, {"enum": [[1], [3, 4]]}]},  # enums apart
    {"oneOf": [{"type": "number", "maximum": 5}, {"type": "number", "minimum": 0}]},  # bounds overlap
    {"oneOf": [{"type": "string", "pattern": "^[a-f]{2}$"}, {"enum": ["", "zz", "ab"]}, {"type": "null"}]},
    {"oneOf": [{"type": "string", "pattern": "^https?://"}, {"type": "string", "pattern": "^\\./"}]},
    {"type": "string", "oneOf": [{"pattern": "^No -"}, {"pattern": "^Primary -"}]},  # strings only: prefixes
    {"oneOf": [{"type": "boolean"}, {"const": True}, {"type": "string", "enum": ["Yes", "no"]}]},
    # named values within a branch of anyOf (judged as the validator does: the values it rejects)
    {"oneOf": [{"enum": ["ab", "zz", 1, 5.5]}, {"anyOf": [{"type": "string", "pattern": "^a"}, {"type": "integer"}]}]},
]


@pytest.mark.parametrize("schema", SCALAR_BRANCHES, ids=str)
@settings(max_examples=80, deadline=None)
@given(data=drawn({"type": ["string", "boolean", "null"], "maxLength": 8}) | NUMBERS)
def test_overlapping_scalar_branches_match_exactly_one(schema: dict[str, Any], data: Any) -> None:
    assert_grammar_agrees(schema, data)


@pytest.mark.parametrize("schema", SCALAR_BRANCHES, ids=str)
@settings(max_examples=50, deadline=None)
@given(data=drawn({"enum": ["linux", "osx", "", "zz", "ab", "ff", "No - x", "Primary - y", "http://a", "./b"]}))
def test_overlapping_branches_at_their_named_values(schema: dict[str, Any], data: Any) -> None:
    assert_grammar_agrees(schema, data)


@settings(max_examples=30, deadline=None)
@given(data=drawn({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "maxItems": 2}))
def test_overlapping_enums_of_arrays(data: Any) -> None:
    assert_grammar_agrees(SCALAR_BRANCHES[1], data)


CARD: dict[str, Any] = {  # a pattern, whose complement is not known, in both
    "type": "object",
    "properties": {"n": {"type": "string", "pattern": "^[0-9]+$"}, "id": {"type": "string"}, "k": SMALL},
    "required": ["n"],
}
REFINED: list[dict[str, Any]] = [
    # one branch is the other and more `required`: within it, the other fails only for want of those
    {"$defs": {"card": CARD}, "oneOf": [{"$ref": "#/$defs/card"}, {**CARD, "required": ["n", "id"]}]},
    {"$defs": {"card": CARD}, "oneOf": [{"$ref": "#/$defs/card"}, {**CARD, "required": ["id", "k"]}]},  # each adds
    # keywords beside a $ref apply (2020-12): the complement reads them too
    {
        "$defs": {"n": {"type": "object", "required": ["n"]}},
        "oneOf": [{"$ref": "#/$defs/n", "required": ["k"]}, {"required": ["id"]}],
    },
    # and beside a $ref the first one leads to
    {
        "$defs": {"n": {"type": "object", "required": ["n"]}, "nk": {"$ref": "#/$defs/n", "required": ["k"]}},
        "oneOf": [{"$ref": "#/$defs/nk"}, {"required": ["id"]}],
    },
]
CARD_VALUES = st.sampled_from(["1", "12", "x", "", 1])


@pytest.mark.parametrize(
    ("schema", "keys"),
    list(zip(REFINED, [["n", "id", "k"], ["n", "id", "k"], ["id", "n", "k"], ["id", "n", "k"]], strict=True)),
    ids=str,
)
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_a_branch_that_refines_another_is_told_apart_by_what_it_adds(
    schema: dict[str, Any], keys: list[str], data: Any
) -> None:
    """Objects with their keys in the order llguidance writes each schema's properties."""
    instance = data.draw(objects_in_order(keys, CARD_VALUES) | st.sampled_from(["1", None, 2]))
    assert_grammar_agrees(schema, instance)


@pytest.mark.parametrize(
    "schema",
    [
        # lower- and upper-case hex overlap on digits, and a pattern has no exact complement
        {"oneOf": [{"type": "string", "pattern": "^[0-9a-f]{4}$"}, {"type": "string", "pattern": "^[0-9A-F]{4}$"}]},
        {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "array", "maxItems": 2}]},
        # strings only (a number matches both), not proven apart, and a pattern has no complement
        {"oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]},
        # "not an integer" is the numbers with a fraction, which have no exact schema
        {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "number", "minimum": 0}]},
        # what one adds reads its siblings (additionalProperties reads properties): not taken apart
        {"$defs": {"card": CARD}, "oneOf": [{"$ref": "#/$defs/card"}, {**CARD, "additionalProperties": False}]},
        {"$defs": {"card": CARD}, "oneOf": [CARD, {**CARD, "properties": {"n": {"pattern": "^1"}}}]},
    ],
    ids=str,
)
def test_overlapping_branches_without_exact_complements_stay_refused_naming_one_of(schema: Any) -> None:
    with pytest.raises(GuideError, match="oneOf"):
        check_grammar(json_schema_grammar(schema))


def test_disjoint_branches_are_left_for_coerce_one_of() -> None:
    schema = {"oneOf": [{"type": "string"}, {"type": "null"}]}
    assert one_of_as_cases(schema) == schema and every_one_of_is_disjoint(schema)


def test_the_rewrite_is_bounded_by_the_proofs_budget() -> None:
    """3,000 overlapping branches, each needing the complement of every other: refused in well under a second."""
    branches = [{"required": [f"p{index}"]} for index in range(3_000)]
    started = time.perf_counter()
    assert one_of_as_cases({"oneOf": branches}) == {"oneOf": branches}
    assert time.perf_counter() - started < 2.0
