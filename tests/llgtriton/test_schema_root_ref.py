"""A schema that refers to its own root is served with the root moved into ``$defs``: the same schema,
which llguidance compiles where the cycle back to the root passes keywords beside a ``$ref``.

Instances are drawn with plain hypothesis strategies (objects, in the schema's property order), judged
by the ``jsonschema`` validator, and the compiled grammar must agree both ways.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_root_ref import ROOT_NAME, root_ref_into_defs
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

# A geometry is a point or a collection of geometries (GeoJSON's shape): the root's own keywords
# beside an `anyOf` whose branch leads back to the root.
GEOMETRY: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "id": "http://example.com/geometry#",
    "type": "object",
    "required": ["t"],
    "properties": {"t": {"type": "string"}},
    "anyOf": [{"$ref": "#/definitions/point"}, {"$ref": "#/definitions/collection"}],
    "definitions": {
        "point": {"required": ["v"], "properties": {"t": {"enum": ["point"]}, "v": {"type": "integer"}}},
        "collection": {
            "required": ["items"],
            "properties": {"t": {"enum": ["collection"]}, "items": {"type": "array", "items": {"$ref": "#"}}},
        },
    },
}
TAGS = st.sampled_from(["point", "collection", "other"])
SCALARS = st.one_of(TAGS, st.integers(-2, 2))
POINTS = objects_in_order(["t", "v"], SCALARS)
GEOMETRIES = st.recursive(
    POINTS, lambda inner: objects_in_order(["t", "items"], st.one_of(TAGS, st.lists(inner, max_size=2))), max_leaves=4
)


@settings(max_examples=80, deadline=None)
@given(instance=GEOMETRIES)
def test_a_schema_that_refers_to_its_root_is_served_exactly(instance: dict[str, Any]) -> None:
    assert_grammar_agrees(GEOMETRY, instance)


def test_the_root_moves_and_every_ref_follows_it() -> None:
    schema = {**GEOMETRY, "properties": {"t": {"type": "string"}, "u": {"$ref": "#/properties/t"}}}
    moved = root_ref_into_defs(schema)
    assert moved["$ref"] == f"#/$defs/{ROOT_NAME}" and moved["definitions"]["point"] == GEOMETRY["definitions"]["point"]
    root = moved["$defs"][ROOT_NAME]
    assert root["properties"]["u"] == {"$ref": f"#/$defs/{ROOT_NAME}/properties/t"}  # same place, moved
    assert root["anyOf"][0] == {"$ref": "#/definitions/point"}  # definitions stay at the root
    assert moved["definitions"]["collection"]["properties"]["items"]["items"] == {"$ref": f"#/$defs/{ROOT_NAME}"}
    assert GEOMETRY["definitions"]["collection"]["properties"]["items"]["items"] == {"$ref": "#"}


@pytest.mark.parametrize(
    "unsure",
    [
        {"point": {"$id": "http://example.com/point", "properties": {"v": {"$ref": "#"}}}},  # "#" is this one
        {"point": {"$ref": "http://example.com/other#"}},  # another document: the base URI matters
        {"point": {"$anchor": "p"}},
    ],
    ids=["nested-id", "remote-ref", "anchor"],
)
def test_a_schema_whose_refs_may_resolve_elsewhere_is_left_alone(unsure: dict[str, Any]) -> None:
    schema = {**GEOMETRY, "definitions": {**GEOMETRY["definitions"], **unsure}}
    assert root_ref_into_defs(schema) == schema


def test_a_root_cycle_through_a_keyword_without_an_exact_rewrite_is_still_refused_naming_it() -> None:
    schema = {"type": "array", "items": {"$ref": "#"}, "not": {"contains": {"type": "string", "pattern": "^a"}}}
    with pytest.raises(GuideError, match="not"):
        check_grammar(json_schema_grammar(schema))
