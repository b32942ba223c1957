"""JSON Schema's ``format``: asserted where llguidance is exact, an annotation (as 2020-12 says) elsewhere."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from llgtriton.guides import json_schema_grammar
from llgtriton.schema_formats import annotations_only
from tests.llgtriton.matching import accepts


def compact(instance: Any) -> str:
    return json.dumps(instance, separators=(",", ":"))


@pytest.mark.parametrize("name", ["int32", "password", "uri-reference", "path", "/^[0-9]{4}/"])
def test_a_format_llguidance_does_not_assert_is_an_annotation_and_the_rest_is_enforced(name: str) -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string", "format": name}, "n": {"type": "integer"}},
        "required": ["id", "n"],
        "additionalProperties": False,
    }
    grammar = json_schema_grammar(schema)  # was a GuideError: "Unknown format"
    valid: list[dict[str, Any]] = [{"id": "any text at all", "n": 3}, {"id": "", "n": -1}]
    invalid: list[dict[str, Any]] = [
        {"id": 7, "n": 3},
        {"id": "x"},
        {"id": "x", "n": 1.5},
        {"id": "x", "n": 1, "extra": 0},
    ]
    for instance in valid:
        jsonschema.validate(instance, schema)  # the default validator reads format as an annotation too
        assert accepts(grammar, compact(instance))
    for instance in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(instance, schema)
        assert not accepts(grammar, compact(instance))


def test_a_format_llguidance_asserts_is_still_enforced() -> None:
    grammar = json_schema_grammar({"type": "string", "format": "date"})
    assert accepts(grammar, '"2026-11-28"')
    assert not accepts(grammar, '"yesterday"')


def test_only_schemas_lose_their_format_never_the_data_or_names_beside_them() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"format": {"enum": [{"format": "int32"}]}, "when": {"type": "string", "format": "date"}},
        "required": ["format"],
        "$defs": {"id": {"anyOf": [{"type": "string", "format": "byte"}, {"items": {"format": "int64"}}]}},
        "default": {"format": "password"},
    }
    heard: list[str] = []
    rewritten = annotations_only(schema, heard.append)
    assert sorted(heard) == ["byte", "int64"]
    assert rewritten["properties"]["format"] == {"enum": [{"format": "int32"}]}  # a property's name, and data
    assert rewritten["properties"]["when"]["format"] == "date"  # asserted: kept
    assert rewritten["$defs"]["id"]["anyOf"] == [{"type": "string"}, {"items": {}}]
    assert rewritten["default"] == {"format": "password"}
    assert schema["$defs"]["id"]["anyOf"][0]["format"] == "byte"  # the caller's schema is left as it was
