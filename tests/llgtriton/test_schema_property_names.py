"""``propertyNames`` written exactly: names every string satisfies are free, listed names become the
only properties; the compiled grammar agrees with the ``jsonschema`` validator on drawn objects."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_property_names import MAX_COPIED_BYTES, property_names_written_out
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

VALUES = st.one_of(st.integers(-5, 5), st.booleans(), st.sampled_from(["x", ""]))
FREE: list[Any] = [True, {}, {"type": "string"}, {"type": ["string", "null"], "description": "any name"}]


@pytest.mark.parametrize("names", FREE, ids=["true", "empty", "string", "string-or-null"])
@settings(max_examples=40, deadline=None)
@given(instance=objects_in_order(["a", "b", "zz"], VALUES))
def test_names_every_string_satisfies_judge_nothing(names: Any, instance: dict[str, Any]) -> None:
    schema = {"type": "object", "propertyNames": names, "additionalProperties": {"type": "integer"}}
    assert_grammar_agrees(schema, instance)


LISTED: list[dict[str, Any]] = [
    {"enum": ["a", "b"]},
    {"type": "string", "const": "b"},
]


@pytest.mark.parametrize("names", LISTED, ids=["enum", "const"])
@settings(max_examples=60, deadline=None)
@given(instance=objects_in_order(["a", "c", "b"], VALUES))
def test_listed_names_are_the_only_properties(names: dict[str, Any], instance: dict[str, Any]) -> None:
    schema = {
        "type": "object",
        "propertyNames": names,
        "properties": {"a": {"type": "integer"}, "c": {"type": "string"}},
        "additionalProperties": {"type": "boolean"},
    }
    assert_grammar_agrees(schema, instance)


@pytest.mark.parametrize(
    "names",
    [{"pattern": "^x"}, {"maxLength": 3}, {"enum": ["a", 1]}, {"type": "integer"}],
    ids=["pattern", "max-length", "non-string-name", "integer"],
)
def test_other_names_are_still_refused_naming_the_keyword(names: dict[str, Any]) -> None:
    with pytest.raises(GuideError, match="propertyNames"):
        check_grammar(json_schema_grammar({"type": "object", "propertyNames": names}))


def test_listed_names_beside_pattern_properties_are_left_to_llguidance() -> None:
    schema = {"type": "object", "propertyNames": {"enum": ["a"]}, "patternProperties": {"^a": {"type": "integer"}}}
    with pytest.raises(GuideError, match="propertyNames"):
        check_grammar(json_schema_grammar(schema))


def test_listed_names_beside_unevaluated_properties_are_left_as_they_are() -> None:
    # (unevaluatedProperties would judge the listed names that properties does not name)
    schema = {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "unevaluatedProperties": {"type": "integer"}}
    assert property_names_written_out(schema) == schema


def test_listed_names_do_not_multiply_a_large_schema_past_the_bound() -> None:
    extra = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 5} for i in range(60)}}
    names = [f"n{i}" for i in range(MAX_COPIED_BYTES // 2000)]  # each copy of extra is over 2,000 bytes
    schema = {"type": "object", "propertyNames": {"enum": names}, "additionalProperties": extra}
    written = property_names_written_out(schema)
    left_alone = "propertyNames" in written and "properties" not in written
    assert left_alone  # (a flag: pytest's account of a failure would print the huge schema)
    with pytest.raises(GuideError, match="propertyNames"):
        check_grammar(json_schema_grammar(schema))
    few = {**schema, "propertyNames": {"enum": names[:3]}}
    assert set(property_names_written_out(few)["properties"]) == {"n0", "n1", "n2"}
