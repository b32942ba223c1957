"""The llguidance side of the grammar-backends comparison, with Llama 3.2's real tokenizer (xgrammar is
not in the lock: its side runs on the GPU machine, bench/gpu_grammar_backends.sh)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.grammar_backends import (
    STEPS,
    Coverage,
    Llguidance,
    batch_paths,
    batched_fill,
    coverage,
    hf_tokenizer,
    on_common_schemas,
)
from bench.llama_model import tokenizer_folder

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "integer"}}},
    "required": ["name", "tags"],
    "additionalProperties": False,
}
ENTRY = {
    "schema": SCHEMA,
    "tests": [
        {"valid": True, "data": {"name": "a rather long name to make the path long", "tags": list(range(12))}},
        {"valid": False, "data": {"name": 3, "tags": []}},
        {"valid": False, "data": {"name": "x"}},
    ],
}


@pytest.fixture(scope="module")
def hf() -> Any:
    return hf_tokenizer(tokenizer_folder())


def test_coverage_counts_valid_accepted_and_invalid_rejected(hf: Any) -> None:
    backend = Llguidance(hf, len(hf))
    broken = {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}}
    result, compiled = coverage(backend, [("ok", ENTRY), ("broken", broken)], encode(hf), len(hf))
    summary = result.summary(2)
    assert (summary["compiled"], list(compiled)) == (1, ["ok"])
    assert (summary["valid_accepted"], summary["valid_total"]) == (1, 1)
    assert (summary["invalid_rejected"], summary["invalid_total"]) == (2, 2)
    assert "broken" in summary["not_compiled"] and summary["mask_us"]["tokens"] > 0
    assert summary["wrong"] == {}


def test_wrong_answers_are_compared_over_the_schemas_both_compiled() -> None:
    schemas = [("a", ENTRY), ("b", ENTRY)]
    strict, lax = Coverage(), Coverage(wrong={"a": (0, 1), "b": (1, 0)})
    common = on_common_schemas(schemas, {"strict": strict, "lax": lax}, {"strict": {"a": 1}, "lax": {"a": 1, "b": 1}})
    assert (common["schemas"], common["valid_total"], common["invalid_total"]) == (1, 1, 2)
    assert common["lax"] == {"valid_rejected": 0, "invalid_accepted": 1}  # b is not common: its miss is not counted
    assert common["strict"] == {"valid_rejected": 0, "invalid_accepted": 0}


def test_a_batch_steps_every_sequence_along_its_valid_path(hf: Any) -> None:
    backend = Llguidance(hf, len(hf))
    _, compiled = coverage(backend, [("ok", ENTRY)], encode(hf), len(hf))
    paths = batch_paths([("ok", ENTRY)], encode(hf), lambda name, tokens: True)
    assert len(paths) == 1 and len(paths[0][1]) >= STEPS
    figures = batched_fill(backend, compiled, paths, 4, len(hf))
    assert figures["steps"] == STEPS and 0 < figures["step_us_p50"] <= figures["step_us_p99"]


def encode(hf: Any) -> Any:
    return lambda text: list(hf.encode(text, add_special_tokens=False))
