"""``not`` among named values: served as the values it keeps where its schema can be judged, refused
(naming it) elsewhere.

The judge must agree with the ``jsonschema`` validator on drawn values; the compiled grammar must
agree with the validator both ways on drawn instances (objects drawn with plain hypothesis
strategies, and the named values themselves, so that some instances are valid).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_not_within import Budget, holds, not_within_values
from llgtriton.schema_values import NoExactComplement
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

scalars = st.integers(-3, 3) | st.sampled_from([0.5, "a", "bar", "", True, None])
lists = st.lists(scalars, max_size=3)
objects = objects_in_order(["a", "aaa", "bar", "foo", "x1"], scalars | lists)
values = scalars | lists | objects

# Negated schemas llgtriton.schema_not has no complement for (objects and arrays read deeply).
JUDGED = [
    {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 2}}},
    {"patternProperties": {"b.*": False, "f.*": True}},
    {
        "additionalProperties": {"type": "integer"},
        "patternProperties": {"f.o": {"minItems": 2}},
        "properties": {"bar": {"type": "array"}, "foo": {"maxItems": 3, "type": "array"}},
    },
    {"$defs": {"s": {"type": "string"}}, "enum": [{"$ref": "#/$defs/s"}, {"a": 1}]},  # a $ref here is data
    {"type": "object", "required": ["a"], "minProperties": 2},
    {"items": {"type": ["integer", "null"]}, "maxItems": 2},
    {
        "anyOf": [
            {"type": "object", "properties": {"a": {"const": "bar"}}},
            {"oneOf": [{"type": "array"}, {"type": ["array", "string"], "maxItems": 2}]},
        ]
    },
    {"not": {"additionalProperties": {"type": "string", "pattern": "^b"}}},
    {"allOf": [{"maxProperties": 1}, {"properties": {"foo": {"enum": [1, 2, "a"]}}}]},
    {
        "anyOf": [
            {"type": "integer", "multipleOf": 2},
            {"type": "number", "multipleOf": 1.5},
            {"type": "array", "items": {"multipleOf": 3}},
        ]
    },
    {"x-project-key": {"not": "a keyword"}, "maxProperties": 1},  # a key no draft defines is ignored
]
NUMBERS: list[Any] = [0, 1, 2, 3, 4.5, 6, -3, 0.5, "6", [3, 6]]
LARGE = [10**30, 10**30 + 1, 10**400]  # judged exactly (llguidance takes no integer past 64 bits)
NAMED: list[Any] = [
    {"a": "bar"},
    {"a": 1},
    {"aaa": 3, "a": 1},
    {"bar": 2, "foo": 1},
    {"foo": []},
    {"foo": [1, 2]},
    {"bar": [], "x1": 3},
    {"$ref": "#/$defs/s"},
    [1, None],
    [1, 2, 3],
    "a",
    1,
    None,
]
SCHEMAS: list[dict[str, Any]] = [
    *({"allOf": [{"enum": NAMED}, {"not": negated}]} for negated in JUDGED),
    {"enum": NAMED, "not": JUDGED[0]},  # the values and the not in one schema
    {"allOf": [{"const": {"bar": 2, "foo": 1}}, {"type": "object", "not": JUDGED[1]}]},
    {"type": "array", "items": {"enum": NAMED[:6], "not": JUDGED[2]}},  # deeper in the schema
    {"allOf": [{"enum": NUMBERS}, {"not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 1.5}]}}]},
    {"allOf": [{"enum": [3]}, {"not": {"allOf": [{"multipleOf": 2}], "anyOf": [{"multipleOf": 3}]}}]},
    # a short run of integers is finitely many values (bounds from both sides, 3.0 equal to 3)
    {"type": "integer", "minimum": -2.5, "exclusiveMaximum": 6, "not": {"anyOf": [{"multipleOf": 2}, {"const": 3}]}},
    {"allOf": [{"type": "integer", "exclusiveMinimum": -3, "maximum": 2}, {"not": {"multipleOf": 1.5}}]},
    # within another schema, beside a not it keeps values of (the overlapping patterns: not compiled)
    {"allOf": [{"enum": NAMED}, {"not": {"not": {"patternProperties": {"a*": {"type": "integer"}, "aa*": {}}}}}]},
]


@pytest.mark.parametrize("negated", JUDGED, ids=str)
@settings(max_examples=150, deadline=None)
@given(value=values | st.sampled_from(NAMED + NUMBERS + LARGE) | st.floats(allow_nan=False, allow_infinity=False))
def test_the_judge_agrees_with_the_validator(negated: dict[str, Any], value: Any) -> None:
    try:
        judged = holds(value, negated, Budget())
    except NoExactComplement:  # 10**400 / 1.5 overflows: the validator fails on it (where it reaches it)
        assert value == 10**400
        return
    assert judged == jsonschema.Draft202012Validator(negated).is_valid(value)


@pytest.mark.parametrize("schema", SCHEMAS, ids=str)
@settings(max_examples=120, deadline=None)
@given(instance=values | st.sampled_from(NAMED + NUMBERS[:-2]) | st.lists(st.sampled_from(NAMED[:6]), max_size=2))
def test_a_not_among_named_values_keeps_the_values_it_rejects(schema: dict[str, Any], instance: Any) -> None:
    assert_grammar_agrees(schema, instance)


def test_no_value_kept_is_a_schema_of_nothing() -> None:
    schema = {"allOf": [{"const": {"a": 1}}, {"not": {"patternProperties": {"a": {"type": "integer"}}}}]}
    assert not_within_values(schema)["allOf"][1] == {"allOf": [False]}


REFUSED = [
    {"not": {"patternProperties": {"a": {"type": "integer"}}}},  # no named values around
    # a $ref is not judged here, and a pattern's complement is not known
    {"allOf": [{"enum": NAMED}, {"not": {"$ref": "#/$defs/s"}}], "$defs": {"s": {"type": "string", "pattern": "^a"}}},
    {"allOf": [{"enum": ["a", "b"]}, {"not": {"type": "string", "format": "email", "pattern": "a"}}]},
    {"allOf": [{"enum": [[1, 2]]}, {"not": {"items": [{"type": "integer"}], "pattern": "a"}}]},  # a tuple
    {"allOf": [{"enum": [{"a": 1}]}, {"not": {"propertyNames": {"pattern": "a"}, "pattern": "a"}}]},
    {"allOf": [{"enum": [1, 2]}, {"not": {"multipleOf": 0}}]},  # not a valid divisor
    {"type": "integer", "minimum": 0, "maximum": 5000, "not": {"multipleOf": 3}},  # too many integers
    {"type": "integer", "minimum": 0, "not": {"multipleOf": 3}},  # unbounded
    {"type": ["integer", "string"], "minimum": 0, "maximum": 3, "not": {"multipleOf": 3}},  # strings too
]


def test_drafts_with_boolean_exclusive_bounds_read_the_others_only() -> None:
    """In draft 4, a numeric exclusiveMaximum only makes maximum exclusive: values up to the maximum
    are kept as candidates (more than the schema allows, which it still says)."""
    negated = {"multipleOf": 2}
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "minimum": 0}
    schema = {**draft4, "maximum": 4, "exclusiveMaximum": 1, "not": negated}
    assert not_within_values(schema)["allOf"] == [{"enum": [1, 3]}]
    later = {**schema, "$schema": "https://json-schema.org/draft/2020-12/schema"}
    assert not_within_values(later)["allOf"] == [False]  # exclusiveMaximum 1: 0 only, a multiple of 2


@pytest.mark.parametrize("schema", REFUSED, ids=str)
def test_a_not_that_cannot_be_judged_is_refused_naming_it(schema: dict[str, Any]) -> None:
    with pytest.raises(GuideError, match="not"):
        check_grammar(json_schema_grammar(schema))


def test_the_judging_is_bounded() -> None:
    budget = Budget(3)
    with pytest.raises(NoExactComplement):
        holds({"a": [1, 2, 3]}, {"properties": {"a": {"items": {"type": "integer"}}}}, budget)


def test_the_rewrite_leaves_the_callers_schema_alone() -> None:
    schema: dict[str, Any] = SCHEMAS[0]
    rewritten = not_within_values(schema)
    assert "not" in schema["allOf"][1] and "not" not in rewritten["allOf"][1]
