"""The conformance benchmark counts a valid instance accepted as written apart from one accepted only
once its object members are in the schema's order (JSON members have no order; llguidance writes
and reads named properties in the schema's order), and never reorders its way past an invalid one."""

from __future__ import annotations

from typing import Any

import llguidance

from bench.jsonschemabench import check_schema, in_schema_order

BYTES = llguidance.LLTokenizer("byte")
POINT: dict[str, Any] = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
}


def test_a_schema_ordered_instance_is_accepted_as_written_and_a_reordered_one_once_reordered() -> None:
    entry = {
        "schema": POINT,
        "tests": [
            {"data": {"x": 1, "y": 2}, "valid": True},
            {"data": {"y": 2, "x": 1}, "valid": True},
            {"data": {"y": "2", "x": 1}, "valid": False},
        ],
    }
    result = check_schema("point", entry, BYTES)
    assert (result.valid_total, result.valid_accepted, result.valid_reordered) == (2, 1, 1)
    assert (result.invalid_total, result.invalid_rejected, result.invalid_reordered_accepted) == (1, 1, 0)


def test_members_the_schema_does_not_name_keep_their_order_after_the_named_ones() -> None:
    schema = {**POINT, "additionalProperties": True}
    ordered = in_schema_order({"z": 0, "y": 2, "a": 9, "x": 1}, schema)
    assert list(ordered) == ["x", "y", "z", "a"]


def test_the_order_follows_refs_all_of_and_the_branch_the_value_matches() -> None:
    schema = {
        "$defs": {"point": POINT},
        "type": "array",
        "items": {
            "allOf": [{"properties": {"kind": {"type": "string"}}}],
            "oneOf": [
                {"properties": {"kind": {"const": "point"}, "at": {"$ref": "#/$defs/point"}}},
                {"properties": {"kind": {"const": "line"}, "to": {"$ref": "#/$defs/point"}, "at": True}},
            ],
        },
    }
    instance = [{"at": {"y": 1, "x": 0}, "kind": "point"}, {"at": 1, "to": {"y": 1, "x": 0}, "kind": "line"}]
    ordered = in_schema_order(instance, schema)
    assert [list(item) for item in ordered] == [["kind", "at"], ["kind", "to", "at"]]
    assert [list(ordered[0]["at"]), list(ordered[1]["to"])] == [["x", "y"], ["x", "y"]]
    assert ordered == instance  # the same JSON value
