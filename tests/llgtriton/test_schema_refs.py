"""A ``$ref`` to a schema kept outside the schema keywords (a root key of the document's own) gets the
same rewrites as any other schema: its target is served exactly, and agrees with the validator."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_refs import stray_refs_into_defs
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
