"""What the ``oneOf`` proof reads off a branch: its anchored literal prefix, and a value judged by it."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings

from llgtriton.schema_judge import judged_alone, literal_prefix, satisfies
from tests.llgtriton.matching import drawn


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        ("^https?://.+$", "http"),
        ("^\\./.+$", "./"),
        ("^Normal -", "Normal -"),
        ("^a+b", "a"),
        ("^ab{2}", "a"),
        ("^a|b", None),  # a second branch, not anchored
        ("abc", None),
        ("^\\d", None),
        ("^[ab]", None),
    ],
)
def test_literal_prefix(pattern: str, prefix: str | None) -> None:
    assert literal_prefix(pattern) == prefix


JUDGED_SCHEMAS: list[dict[str, Any]] = [
    {"type": "string", "pattern": "^[a-c]{2}$", "maxLength": 3},
    {"type": ["integer", "null"], "minimum": 1, "exclusiveMaximum": 4},
    {"enum": [1, "a", True, None, [1]]},
    {"const": 1.0, "description": "one"},
]


@pytest.mark.parametrize("schema", JUDGED_SCHEMAS, ids=str)
@settings(max_examples=60, deadline=None)
@given(value=drawn({"type": ["string", "integer", "boolean", "null"], "maxLength": 3}, {"enum": [1.0, 1, [1], True]}))
def test_satisfies_agrees_with_the_validator(schema: dict[str, Any], value: Any) -> None:
    assert judged_alone(schema)
    assert satisfies(value, schema) == jsonschema.Draft202012Validator(schema).is_valid(value)


def test_a_schema_with_other_keywords_is_not_judged_alone() -> None:
    assert not judged_alone({"type": "string", "format": "email"})
    assert not judged_alone({"minimum": 0, "exclusiveMinimum": True})  # draft 4's boolean form
