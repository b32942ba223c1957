"""Constraint formats to llguidance grammars, shared by the proxy (early 400s) and the backend.

Every format of the wire contract (``guided_decoding_guide_type``) maps to one llguidance
grammar string. ``check_grammar`` compiles it without a tokenizer, so the proxy can refuse a bad
constraint before Triton sees it; the backend compiles it again against the model's tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import llguidance
from llguidance import LLMatcher

if TYPE_CHECKING:  # the TypedDict exists only in llguidance's type stubs
    from llguidance._lib import JsonCompileOptions

from llgtriton.wire import GuideType

# JSON output is compact apart from one space after ',' and ':' (as Python's json.dumps writes it):
# llguidance's default whitespace is unbounded, and small models loop on newlines.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
MAX_GUIDE_BYTES = 1 << 20


class GuideError(ValueError):
    """A constraint that cannot be compiled; the message is llguidance's."""


@contextmanager
def llguidance_panics_refused() -> Iterator[None]:
    """Turn a panic inside llguidance (pyo3's ``PanicException``, a ``BaseException``) into a :class:`GuideError`.

    Some malformed constraints make llguidance's Rust code panic, e.g. while it formats an error
    message around a non-ASCII character. Such a constraint is refused like any other bad one.
    """
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise GuideError(f"llguidance could not process the constraint: {str(exc)[:500]}") from None


def _json_document(guide: str, what: str) -> Any:
    try:
        return json.loads(guide)
    except json.JSONDecodeError as exc:
        raise GuideError(f"the {what} is not valid JSON: {exc}") from None


def json_schema_grammar(schema: Any) -> str:
    if schema is False:  # JSON Schema's "nothing": llguidance reports it as unsatisfiable
        return str(LLMatcher.grammar_from_json_schema("false"))
    if schema is True:  # JSON Schema's "anything"
        schema = {}
    if not isinstance(schema, dict):
        raise GuideError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
    try:
        return str(LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
    except ValueError as exc:  # e.g. an integer beyond 64 bits anywhere in the schema
        raise GuideError(f"the JSON schema cannot be used: {exc}") from None


def choice_grammar(choices: Any) -> str:
    if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
        raise GuideError("a choice constraint is a non-empty list of strings")
    return "start: " + " | ".join(json.dumps(choice) for choice in choices)


def grammar_for(guide_type: GuideType, guide: str | None) -> str:
    """The llguidance grammar for one constraint; raises :class:`GuideError`."""
    with llguidance_panics_refused():
        return _grammar_for(guide_type, guide)


def _grammar_for(guide_type: GuideType, guide: str | None) -> str:
    if guide is not None and len(guide.encode()) > MAX_GUIDE_BYTES:
        raise GuideError(f"the constraint is {len(guide.encode())} bytes; the limit is {MAX_GUIDE_BYTES}")
    if guide_type is GuideType.JSON:
        schema = ANY_JSON_OBJECT if not guide else _json_document(guide, "JSON schema")
        return json_schema_grammar(schema)
    if guide is None or guide == "":
        raise GuideError(f"guide type {guide_type.value!r} needs a guide")
    if guide_type is GuideType.JSON_SCHEMA:
        return json_schema_grammar(_json_document(guide, "JSON schema"))
    if guide_type is GuideType.REGEX:
        return str(LLMatcher.grammar_from_regex(guide))
    if guide_type is GuideType.CHOICE:
        return choice_grammar(_json_document(guide, "choice list"))
    if guide_type is GuideType.EBNF_GRAMMAR:
        try:
            return str(llguidance.grammar_from("ebnf", guide))
        except Exception as exc:  # the GBNF converter raises plain exceptions on bad input
            raise GuideError(f"invalid EBNF grammar: {exc}") from None
    return str(LLMatcher.grammar_from_lark(guide))


def check_grammar(grammar: str, tokenizer: llguidance.LLTokenizer | None = None) -> None:
    """Compile ``grammar`` (against ``tokenizer`` when given); raise :class:`GuideError` if it fails."""
    with llguidance_panics_refused():
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise GuideError("; ".join(m.strip() for m in messages) or "the grammar does not compile")
