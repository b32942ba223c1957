"""``dependencies``, ``dependentRequired`` and ``dependentSchemas`` served exactly, as ``anyOf`` cases.

The property tests draw instances (objects with their keys in the schema's order, which llguidance's
grammars follow), let the ``jsonschema`` validator of each schema's draft judge them, and check that
the compiled grammar agrees both ways.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.schema_dependencies import dependencies_as_any_of
from tests.llgtriton.matching import assert_grammar_agrees, objects_in_order

PROPERTIES = {"card": {"type": "integer"}, "billing": {"type": "string"}, "kind": {"type": "string"}}
DRAFT7_BOTH_FORMS: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": PROPERTIES,
    "dependencies": {"card": ["billing"], "kind": {"properties": {"billing": {"const": "x"}}}},
}
DRAFT2020_NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "payment": {
            "type": "object",
            "properties": PROPERTIES,
            "additionalProperties": False,
            "dependentRequired": {"card": ["billing", "kind"]},
            "dependentSchemas": {"billing": {"required": ["card"]}},
        }
    },
}

values = st.integers(0, 3) | st.sampled_from(["x", "y", ""])


@settings(max_examples=200, deadline=None)
@given(objects_in_order(["card", "billing", "kind"], values) | values)
def test_draft7_dependencies_of_names_and_of_a_schema(instance: Any) -> None:
    assert_grammar_agrees(DRAFT7_BOTH_FORMS, instance)


@settings(max_examples=200, deadline=None)
@given(
    objects_in_order(["payment"], values).filter(lambda o: "payment" not in o)
    | objects_in_order(["card", "billing", "kind"], values).map(lambda payment: {"payment": payment})
)
def test_dependent_required_and_schemas_inside_a_property(instance: Any) -> None:
    assert_grammar_agrees(DRAFT2020_NESTED, instance)


def test_the_rewrite_leaves_the_callers_schema_and_other_keywords_alone() -> None:
    rewritten = dependencies_as_any_of(DRAFT7_BOTH_FORMS)
    assert "dependencies" in DRAFT7_BOTH_FORMS and "dependencies" not in rewritten
    assert rewritten["properties"] == PROPERTIES and len(rewritten["allOf"]) == 2
    check_grammar(json_schema_grammar(DRAFT7_BOTH_FORMS))  # was refused: "Unimplemented keys: dependencies"


# An empty dependency map asserts nothing; llguidance refused the keyword all the same.
EMPTY_DEPENDENCIES: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"card": {"type": "integer"}},
    "dependencies": {},
}


@settings(max_examples=40, deadline=None)
@given(instance=objects_in_order(["card", "other"], st.one_of(st.integers(-3, 3), st.text(max_size=2))))
def test_an_empty_dependency_map_is_dropped(instance: dict[str, Any]) -> None:
    assert_grammar_agrees(EMPTY_DEPENDENCIES, instance)


def test_a_dependency_without_an_exact_case_is_still_refused_naming_the_keyword() -> None:
    schema = {"type": "object", "dependencies": {"a": 3}}  # neither names nor a schema: nothing to rewrite
    with pytest.raises(GuideError, match="dependencies"):
        check_grammar(json_schema_grammar(schema))
