"""Whether a grammar can produce a text (llguidance's matcher over its byte tokenizer), and whether a
schema's grammar agrees with the ``jsonschema`` validator on drawn instances."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import llguidance
from hypothesis import strategies as st
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


def assert_grammar_agrees(schema: dict[str, Any], instance: Any) -> None:
    """``schema``'s grammar produces ``instance`` exactly when the validator of its draft accepts it."""
    valid = jsonschema.validators.validator_for(schema)(schema).is_valid(instance)
    assert accepts(json_schema_grammar(schema), json.dumps(instance, separators=(",", ":"))) == valid, instance
