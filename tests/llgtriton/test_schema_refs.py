"""A ``$ref`` to a schema kept outside the schema keywords (a root key of the document's own) gets the
same rewrites as any other schema: its target is served exactly, and agrees with the validator."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_refs import MAX_COPIED_BYTES, stray_refs_into_defs
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

# A root key that is not a keyword holds two schemas: one with a format llguidance does not know
# (an annotation here, as anywhere else), one that refers on to the first.
STRAY: dict[str, Any] = {
    "type": "object",
    "shapes": {
        "color": {"type": "string", "maxLength": 3, "format": "color-hex"},
        "colors": {"type": "array", "items": {"$ref": "#/shapes/color"}, "maxItems": 2},
    },
    "properties": {"a": {"$ref": "#/shapes/color"}, "b": {"$ref": "#/shapes/colors"}},
    "additionalProperties": False,
}
VALUES = st.one_of(st.sampled_from(["", "#0f", "#0f0f"]), st.lists(st.sampled_from(["ab", "abcd"]), max_size=3))


@settings(max_examples=60, deadline=None)
@given(instance=objects_in_order(["a", "b"], VALUES))
def test_a_schema_kept_at_a_root_key_is_served_exactly(instance: dict[str, Any]) -> None:
    assert_grammar_agrees(STRAY, instance)


def test_the_refs_point_into_defs_and_the_callers_schema_is_left_alone() -> None:
    moved = stray_refs_into_defs(STRAY)
    assert moved["properties"]["a"]["$ref"].startswith("#/$defs/")
    copied = moved["$defs"][moved["properties"]["b"]["$ref"].removeprefix("#/$defs/")]
    assert copied["items"]["$ref"] == moved["properties"]["a"]["$ref"]  # the chain is followed
    assert STRAY["properties"]["a"] == {"$ref": "#/shapes/color"}


def test_refs_into_defs_and_properties_are_left_as_they_are() -> None:
    schema = {
        "$defs": {"x": {"type": "integer"}},
        "properties": {"a": {"$ref": "#/$defs/x"}, "b": {"$ref": "#/properties/a"}},
    }
    assert stray_refs_into_defs(schema) == schema


def test_a_stray_target_without_an_exact_rewrite_is_still_refused_naming_its_keyword() -> None:
    schema = {"type": "object", "kept": {"not": {"pattern": "^a"}}, "properties": {"a": {"$ref": "#/kept"}}}
    with pytest.raises(GuideError, match="not"):
        check_grammar(json_schema_grammar(schema))


def test_one_place_spelled_many_ways_is_copied_once() -> None:
    spellings = ["#/kept", "#/%6Bept", "#/k%65pt", "#/ke%70t"]
    schema = {"kept": {"type": "integer"}, "properties": {str(i): {"$ref": ref} for i, ref in enumerate(spellings)}}
    moved = stray_refs_into_defs(schema)
    assert len(moved["$defs"]) == 1
    assert {inner["$ref"] for inner in moved["properties"].values()} == {"#/$defs/llgtriton-ref-0"}


def test_copies_past_the_bound_leave_the_schema_as_it_was() -> None:
    # A $ref to every level of a deep target would copy each level: a schema many times its size.
    level: dict[str, Any] = {"type": "string", "description": "x" * (MAX_COPIED_BYTES // 8)}
    for _ in range(12):
        level = {"type": "object", "properties": {"next": level}}
    refs = ["#/kept" + "/properties/next" * depth for depth in range(12)]
    schema = {"kept": level, "properties": {str(i): {"$ref": ref} for i, ref in enumerate(refs)}}
    moved = stray_refs_into_defs(schema)
    left_alone = "$defs" not in moved and moved["properties"]["0"] == {"$ref": "#/kept"}
    assert left_alone  # (a flag: pytest's account of a failure would print the large schema)


# A $ref into a `not` that the rewrites replace (not-not-X becomes X): it must still name X after that.
INTO_A_NOT: dict[str, Any] = {
    "allOf": [
        {"enum": [{"foo": False}, {"foo": {"foo": 1}}, {"foo": {"foo": {}}}, {"bar": 1}, 3]},
        {"not": {"not": {"additionalProperties": False, "properties": {"foo": {"$ref": "#/allOf/1/not/not"}}}}},
    ]
}
NAMED = [{"foo": False}, {"foo": {"foo": 1}}, {"foo": {"foo": {}}}, {"bar": 1}, 3, {}, {"foo": []}]


@settings(max_examples=30, deadline=None)
@given(instance=st.sampled_from(NAMED))
def test_a_ref_into_a_rewritten_not_names_the_same_schema(instance: Any) -> None:
    assert_grammar_agrees(INTO_A_NOT, instance)


def test_a_ref_into_a_not_points_at_a_copy() -> None:
    moved = stray_refs_into_defs(INTO_A_NOT)
    copy = moved["$defs"]["llgtriton-ref-0"]
    assert copy["properties"]["foo"] == {"$ref": "#/$defs/llgtriton-ref-0"}  # the copy refers to itself
    assert INTO_A_NOT["allOf"][1]["not"]["not"]["properties"]["foo"] == {"$ref": "#/allOf/1/not/not"}
