"""``minProperties: 1`` beside optional properties, served as cases over which member is present:
the grammar must agree with ``jsonschema`` both ways (objects by plain hypothesis strategies, in the
schema's order; see :mod:`tests.llgtriton.matching`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.llgtriton.matching import assert_grammar_agrees, drawn, objects_in_order

SMALL = {"type": "integer", "minimum": 0, "maximum": 2}
OPEN: dict[str, Any] = {"type": "object", "properties": {"a": SMALL, "b": SMALL}, "minProperties": 1}
CLOSED: dict[str, Any] = {**OPEN, "additionalProperties": False}
PATTERNS: dict[str, Any] = {
    "properties": {"a": SMALL, "b": SMALL},
    "patternProperties": {"^z": SMALL},
    "additionalProperties": False,
    "minProperties": 1,
}


@pytest.mark.parametrize("schema", [OPEN, CLOSED, PATTERNS], ids=["open", "closed", "patterns, no type"])
@settings(max_examples=80, deadline=None)
@given(instance=objects_in_order(["a", "b", "q", "z"], st.integers(0, 3)) | drawn({"type": ["integer", "null"]}))
def test_an_object_with_at_least_one_member(schema: dict[str, Any], instance: Any) -> None:
    assert_grammar_agrees(schema, instance)
