"""``not: {$ref: ...}`` written as the complement of the schema the ``$ref`` points at in the same
document; a recursive one stays a 400 naming ``not``. The grammar must agree with ``jsonschema``
both ways on drawn instances."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from tests.llgtriton.matching import assert_grammar_agrees, drawn

KINDS = {"enum": ["Float", "Text", 3]}
SCHEMAS: list[dict[str, Any]] = [
    {"definitions": {"kinds": KINDS, "other": {"not": {"$ref": "#/definitions/kinds"}}}, "$ref": "#/definitions/other"},
    {"$defs": {"kinds": KINDS, "short": {"$ref": "#/$defs/kinds"}}, "not": {"$ref": "#/$defs/short"}},
    {"$defs": {"n": {"type": "integer", "maximum": 3}}, "type": "integer", "not": {"$ref": "#/$defs/n"}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["draft-7 definitions", "a $ref to a $ref", "bounds"])
@settings(max_examples=80, deadline=None)
@given(data=drawn({"type": ["string", "integer", "null", "boolean"], "maxLength": 6}) | st.sampled_from(KINDS["enum"]))
def test_not_a_ref_is_the_complement_of_its_target(schema: dict[str, Any], data: Any) -> None:
    assert_grammar_agrees(schema, data)


def test_a_recursive_ref_under_not_stays_refused() -> None:
    chain = {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/chain"}]}
    schema = {"$defs": {"chain": chain}, "not": {"$ref": "#/$defs/chain"}}
    with pytest.raises(GuideError, match="not"):
        check_grammar(json_schema_grammar(schema))
