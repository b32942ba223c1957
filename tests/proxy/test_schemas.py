"""proxy.schemas: objects that declare properties are closed unless the schema opens them."""

from __future__ import annotations

import json
from typing import Any

from llgtriton.guides import grammar_for
from llgtriton.wire import GuideType
from proxy.schemas import closed_objects
from tests.llgtriton.matching import accepts


def test_nested_objects_and_definitions_are_closed() -> None:
    schema: dict[str, Any] = {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "type": "object",
        "properties": {
            "at": {"$ref": "#/$defs/Point"},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "either": {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "null"}]},
        },
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["Point"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is left as it was


def test_objects_opened_explicitly_or_without_properties_stay_open() -> None:
    opened = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert closed_objects(opened) == opened
    assert closed_objects({"type": "object"}) == {"type": "object"}
    patterned = {"type": "object", "properties": {}, "patternProperties": {"^x": {}}}
    assert closed_objects(patterned) == patterned


def test_a_closed_object_generates_no_undeclared_or_repeated_keys() -> None:
    schema = closed_objects({"type": "object", "properties": {"a": {"type": "integer"}}})
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps(schema))
    assert accepts(grammar, '{"a": 1}')
    assert not accepts(grammar, '{"a": 1, "b": 2}')
    assert not accepts(grammar, '{"a": 1, "a": 2}')
