"""Whether a grammar can produce a text: llguidance's matcher over its byte tokenizer."""

from __future__ import annotations

import llguidance
from llguidance import LLMatcher

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
