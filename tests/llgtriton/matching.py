"""Whether a grammar can produce a text (llguidance's matcher over its byte tokenizer), and whether a
schema's grammar agrees with the ``jsonschema`` validator on drawn instances."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import llguidance
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from llguidance import LLMatcher

from llgtriton.guides import json_schema_grammar

BYTE_TOKENIZER = llguidance.LLTokenizer("byte")


def matcher(grammar: str) -> LLMatcher:
    """A matcher for ``grammar`` over the byte tokenizer; the grammar must compile."""
    built = LLMatcher(BYTE_TOKENIZER, grammar, log_level=0)
    assert not built.is_error(), built.get_error()
    return built


def accepts(grammar: str, text: str) -> bool:
    """Whether a generation constrained by ``grammar`` can produce exactly ``text`` and stop."""
    built = matcher(grammar)
    consumed = built.consume_tokens(BYTE_TOKENIZER.tokenize_str(text))
    return consumed and not built.is_error() and built.is_accepting()


def objects_in_order(keys: list[str], value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of ``keys``, in that order (the order llguidance's grammars follow)."""
    return st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)).flatmap(
        lambda chosen: st.tuples(*(value for on in chosen if on)).map(
            lambda drawn: dict(zip([key for key, on in zip(keys, chosen, strict=True) if on], drawn, strict=True))
        )
    )


def drawn(*schemas: Any) -> st.SearchStrategy[Any]:
    """Instances hypothesis-jsonschema draws from any of ``schemas`` (schemas near the one under test,
    so that some instances are valid and some not). Not objects: hypothesis-jsonschema 0.23.1 cannot
    draw them with the locked hypothesis (it calls a private helper hypothesis has changed)."""
    return st.one_of([from_schema(schema) for schema in schemas])


def instance_text(instance: Any) -> str:
    """JSON as llguidance writes it: characters as they are (it takes ``\\u`` escapes only for the
    control characters, DEL among them), no spaces."""
    return json.dumps(instance, ensure_ascii=False, separators=(",", ":")).replace("\x7f", "\\u007f")


def assert_grammar_agrees(schema: Any, instance: Any) -> None:
    """``schema``'s grammar produces ``instance`` exactly when the validator of its draft accepts it."""
    valid = jsonschema.validators.validator_for(schema)(schema).is_valid(instance)
    assert accepts(json_schema_grammar(schema), instance_text(instance)) == valid, (instance, valid)
