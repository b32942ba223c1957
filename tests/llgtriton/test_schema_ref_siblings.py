"""A draft-07 schema's ``$ref`` is the schema it names, its other keywords ignored; later drafts apply them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from llgtriton.schema_ref_siblings import ref_siblings_ignored
from tests.llgtriton.matching import assert_grammar_agrees, drawn

DEFINITIONS = {"definitions": {"short": {"type": "string", "maxLength": 2}}}
DRAFT_07: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    **DEFINITIONS,
    "type": "array",
    "items": {"$ref": "#/definitions/short", "minLength": 2, "type": ["string", "null"]},
}
DRAFT_2020: dict[str, Any] = {**DRAFT_07, "$schema": "https://json-schema.org/draft/2020-12/schema"}


@pytest.mark.parametrize("schema", [DRAFT_07, DRAFT_2020], ids=["draft-07", "2020-12"])
@settings(max_examples=60, deadline=None)
@given(instance=drawn({"type": "array", "items": {"type": ["string", "null"], "maxLength": 3}, "maxItems": 3}))
def test_ref_siblings_follow_the_schemas_draft(schema: dict[str, Any], instance: Any) -> None:
    assert_grammar_agrees(schema, instance)


def test_definitions_beside_a_ref_stay() -> None:
    schema: dict[str, Any] = {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/x"}
    schema |= {"type": "string", "definitions": {"x": {"type": "integer"}}}
    assert ref_siblings_ignored(schema) == {
        "$ref": "#/definitions/x",
        "definitions": {"x": {"type": "integer"}},
        "$schema": "http://json-schema.org/draft-07/schema#",
    }
