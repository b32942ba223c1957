"""Constraint formats to llguidance grammars, shared by the proxy (early 400s) and the backend.

Every format of the wire contract (``guided_decoding_guide_type``) maps to one llguidance
grammar string. ``check_grammar`` compiles it without a tokenizer, so the proxy can refuse a bad
constraint before Triton sees it; the backend compiles it again against the model's tokenizer.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import llguidance
from llguidance import LLMatcher

if TYPE_CHECKING:  # the TypedDict exists only in llguidance's type stubs
    from llguidance._lib import JsonCompileOptions

from llgtriton.json_schemas import local_target
from llgtriton.schema_dependencies import dependencies_as_any_of
from llgtriton.schema_formats import annotations_only
from llgtriton.schema_min_properties import min_properties_as_cases
from llgtriton.schema_not import not_as_complement
from llgtriton.schema_not_within import not_within_values
from llgtriton.schema_one_of import every_one_of_is_disjoint
from llgtriton.schema_one_of_cases import one_of_as_cases
from llgtriton.schema_one_of_types import one_of_types_narrowed
from llgtriton.schema_property_names import property_names_written_out
from llgtriton.schema_ref_siblings import ref_siblings_ignored
from llgtriton.schema_refs import stray_refs_into_defs
from llgtriton.schema_root_ref import root_ref_into_defs
from llgtriton.structural_tags import StructuralTag
from llgtriton.wire import GuideType

# Between JSON tokens: nothing, one space, or one newline and an indentation of at most
# MAX_JSON_INDENT spaces or tabs. A model can follow the layout its prompt shows (json.dumps with
# or without indent=2) but cannot loop on whitespace, as it does under llguidance's unbounded default.
MAX_JSON_INDENT = 24
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "whitespace_pattern": rf"( |\n[ \t]{{0,{MAX_JSON_INDENT}}})?",
    "item_separator": ",",
    "key_separator": ":",
}
# The alternative a request may ask for: exactly ", " and ": " (as json.dumps writes it) and no other whitespace.
COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "whitespace_pattern": None,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
MAX_GUIDE_BYTES = 1 << 20
# llguidance recurses natively once per grammar rule and JSON-schema $ref: a chain of ~1,500 $refs
# overflows a thread's usual 8 MiB stack and kills the process. Compiles get this much (reserved,
# committed only as used), enough for the longest chain that fits in MAX_GUIDE_BYTES.
COMPILE_STACK_BYTES = 512 << 20
COMPILE_TIMEOUT_S = 10.0  # a constraint that takes longer to compile is refused
MAX_CONCURRENT_COMPILES = 4  # compiles running at once in a process, timed-out ones included
MAX_MESSAGE_CHARS = 500  # of llguidance's messages, which can hold a whole parser state
# Bounds on what the compilers see, far above real constraints (docs/reliability.md): the deepest
# path through a JSON schema, $refs followed, in objects and arrays; and rules in a grammar.
MAX_SCHEMA_DEPTH = 256
MAX_GRAMMAR_RULES = 2000
# GBNF goes through llguidance's pure-Python converter first, whose time grows with the square of
# the rules (0.14 s for 500, 2.2 s for 2,000 on 2 cores) while it holds the GIL the step loop needs.
MAX_GBNF_RULES = 500

_T = TypeVar("_T")
logger = logging.getLogger(__name__)


class GuideError(ValueError):
    """A constraint that cannot be compiled; the message is llguidance's."""


class CompilerBusy(RuntimeError):
    """Every compile slot is taken (by slow constraints still compiling): try again later."""


def short(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE_CHARS`, for errors that echo llguidance's text."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + " [...]"


_compile_slots = threading.BoundedSemaphore(MAX_CONCURRENT_COMPILES)
_stack_size_lock = threading.Lock()


def on_compile_thread(work: Callable[[], _T], timeout_s: float = COMPILE_TIMEOUT_S) -> _T:
    """``work()`` on a thread of its own with :data:`COMPILE_STACK_BYTES` of stack, waited for at most ``timeout_s``.

    Raises :class:`GuideError` when it takes longer (the thread runs on, holding its slot until it
    ends, since native code cannot be interrupted) and :class:`CompilerBusy` when no slot frees up.
    """
    if not _compile_slots.acquire(timeout=timeout_s):
        raise CompilerBusy(f"{MAX_CONCURRENT_COMPILES} constraints are compiling already; try again later")
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # handed to the waiting thread, which raises it
            outcome.append((False, exc))
        finally:
            _compile_slots.release()

    try:
        with _stack_size_lock:  # the size is process-wide: set it for this one thread only
            previous = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                thread = threading.Thread(target=run, name="llgtriton-compile", daemon=True)
                thread.start()
            finally:
                threading.stack_size(previous)
    except BaseException:
        _compile_slots.release()
        raise
    thread.join(timeout_s)
    if not outcome:
        raise GuideError(f"the constraint did not compile within {timeout_s:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    result: _T = value
    return result


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
        raise GuideError(f"llguidance could not process the constraint: {short(str(exc))}") from None


def _json_document(guide: str, what: str) -> Any:
    try:
        return json.loads(guide)
    except (ValueError, RecursionError) as exc:  # not JSON, too deep, or an int of >4300 digits
        raise GuideError(f"the {what} is not valid JSON: {short(str(exc)) or type(exc).__name__}") from None


class _TooDeep(Exception):
    pass


def schema_depth(schema: Any, limit: int = MAX_SCHEMA_DEPTH) -> int:
    """Objects and arrays on the deepest path through ``schema``, local ``$ref``s followed (a cycle
    ends a path: recursive schemas are fine). Raises :class:`GuideError` past ``limit``.

    Recursion is bounded by ``limit``, so a hostile schema cannot exhaust Python's either.
    """
    heights: dict[int, int] = {}
    on_path: set[int] = set()

    def height(node: Any, depth: int) -> int:
        if not isinstance(node, dict | list):
            return 0
        if depth > limit:
            raise _TooDeep
        key = id(node)
        if key in heights:
            return heights[key]
        if key in on_path:
            return 0
        on_path.add(key)
        children = list(node.values()) if isinstance(node, dict) else node
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            children.append(local_target(schema, node["$ref"]))
        best = max((height(child, depth + 1) for child in children), default=0)
        on_path.discard(key)
        heights[key] = best + 1
        return best + 1

    try:
        return height(schema, 1)
    except _TooDeep:
        raise GuideError(f"the JSON schema nests deeper than {limit} levels, counting each $ref it follows") from None


def grammar_rules(grammar: str) -> int:
    """Rules (and terminals) a Lark or GBNF grammar defines: the lines that start a definition."""
    return len(_RULE_START.findall(grammar))


_RULE_START = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_-]*(?:\.-?\d+)?[ \t]*(?::|::=)", re.MULTILINE)


def _check_rules(grammar: str, limit: int) -> None:
    rules = grammar_rules(grammar)
    if rules > limit:
        raise GuideError(f"the grammar defines {rules} rules; the limit is {limit}")


def lark_text(text: str, special: Mapping[str, int]) -> str:
    """``text`` as a Lark rule body: quoted strings, each of ``special``'s tokens (by their text) as
    the token itself (``<[id]>``), which a quoted string never matches: a special token is no text."""
    if not text:
        return ""
    names = sorted((name for name in special if name and name in text), key=len, reverse=True)
    if not names:
        return json.dumps(text)
    pieces = re.split("(" + "|".join(re.escape(name) for name in names) + ")", text)
    return " ".join(f"<[{special[piece]}]>" if piece in special else json.dumps(piece) for piece in pieces if piece)


def with_json_options(schema: Any, options: JsonCompileOptions | dict[str, Any]) -> Any:
    """``schema`` written with ``options`` (llguidance's ``x-guidance`` key); its own ``x-guidance`` wins."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        return schema
    own = schema.get("x-guidance")
    return {**schema, "x-guidance": {**options, **(own if isinstance(own, dict) else {})}}


def _exact_schema(schema: Any) -> tuple[dict[str, Any], JsonCompileOptions]:
    """``schema`` rewritten where llguidance would not serve it exactly, and the options it compiles with."""
    if schema is True:  # JSON Schema's "anything"
        schema = {}
    if not isinstance(schema, dict):
        raise GuideError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
    schema_depth(schema)
    schema = stray_refs_into_defs(root_ref_into_defs(schema))
    schema = annotations_only(schema, lambda name: logger.info("format %r is an annotation, not asserted", name))
    schema = property_names_written_out(ref_siblings_ignored(schema))
    schema = not_as_complement(not_within_values(dependencies_as_any_of(schema)))
    schema = min_properties_as_cases(one_of_types_narrowed(schema))
    cases = one_of_as_cases(schema)
    if cases != schema and not _one_of_served_alone(schema):
        schema = cases
    options: JsonCompileOptions = JSON_OPTIONS
    if every_one_of_is_disjoint(schema):  # then anyOf is exactly oneOf
        options = {**JSON_OPTIONS, "coerce_one_of": True}
    return schema, options


def _one_of_served_alone(schema: dict[str, Any]) -> bool:
    """Whether llguidance serves the schema's ``oneOf``s as they are: it proves some disjoint itself
    (exactly), and its own reading keeps the properties in an order the cases would change."""

    def compiles() -> bool:
        with llguidance_panics_refused():
            grammar = str(LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
            is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, None)
        return not (is_error and any("oneOf" in message for message in messages))

    try:
        return on_compile_thread(compiles)
    except ValueError:  # refused for another reason, which the compile after names
        return True


def json_schema_grammar(schema: Any) -> str:
    if schema is False:  # JSON Schema's "nothing": llguidance reports it as unsatisfiable
        return str(LLMatcher.grammar_from_json_schema("false"))
    schema, options = _exact_schema(schema)
    try:
        return str(LLMatcher.grammar_from_json_schema(schema, defaults=options))
    except ValueError as exc:  # e.g. an integer beyond 64 bits anywhere in the schema
        raise GuideError(f"the JSON schema cannot be used: {short(str(exc))}") from None


def structural_tag_grammar(document: Any) -> str:
    """The Lark grammar of a structural tag (:mod:`llgtriton.structural_tags`), each schema served as
    a JSON schema constraint is."""
    try:
        tag = StructuralTag.parse(document)
    except ValueError as exc:
        raise GuideError(f"invalid structural tag: {exc}") from None

    def json_body(schema: dict[str, Any] | bool) -> str:
        if schema is False:
            raise GuideError("a structure whose schema is false can never be written")
        return json.dumps(with_json_options(*_exact_schema(schema)))

    lark = tag.lark(json_body)
    _check_rules(lark, MAX_GRAMMAR_RULES)
    return lark


def choice_grammar(choices: Any) -> str:
    """A Lark grammar matching exactly one of ``choices``: one lexeme, shaped as a trie of their prefixes.

    The lexer matches it, however many choices there are (100,000 compile in about a second). As
    grammar rules, more than 2,000 branches overflow llguidance's Earley row and a trie of them
    passes its 65,000 grammar symbols; a flat alternation in a lexeme makes the lexer build a
    new expression per choice per character. The list's size is bounded by the constraint's (1 MiB).
    """
    if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
        raise GuideError("a choice constraint is a non-empty list of strings")
    words = sorted({choice for choice in choices if choice})
    if not words:
        return 'start: ""'
    try:
        trie = _trie_expression(words, 0)
    except RecursionError:  # ~1,000 choices, each a prefix of the next
        raise GuideError("the choices nest too deeply: too many of them are prefixes of others") from None
    optional = "?" if "" in choices else ""  # a lexeme cannot be empty: the empty choice is the lexeme left out
    return f"start: CHOICE{optional}\nCHOICE: {trie}\n"


def _trie_expression(choices: list[str], depth: int) -> str:
    """Lark for the suffixes from ``depth`` of ``choices`` (sorted, distinct, sharing ``choices[0][:depth]``).

    Iterative over the characters each branch shares, recursive only at branch points, whose
    number is bounded by the number of choices.
    """
    start = depth
    while True:
        if depth == len(choices[0]) or any(len(c) == depth or c[depth] != choices[0][depth] for c in choices):
            break
        depth += 1
    shared = json.dumps(choices[0][start:depth]) if depth > start else ""
    if len(choices) == 1:
        return shared or '""'
    branches = []
    ends_here = choices[0] == choices[0][:depth]  # sorted: the choice that ends here comes first
    rest = choices[1:] if ends_here else choices
    group_start = 0
    for index in range(1, len(rest) + 1):
        if index == len(rest) or rest[index][depth] != rest[group_start][depth]:
            branches.append(_trie_expression(rest[group_start:index], depth))
            group_start = index
    alternatives = " | ".join(branches)
    tail = f"({alternatives})?" if ends_here else f"({alternatives})"
    return f"{shared} {tail}" if shared else tail


def grammar_for(guide_type: GuideType, guide: str | None) -> str:
    """The llguidance grammar for one constraint; raises :class:`GuideError`.

    Runs on a compile thread (:func:`on_compile_thread`): converting a JSON schema recurses per $ref.
    """
    if guide is not None:
        _check_size(guide)

    def convert() -> str:
        with llguidance_panics_refused():
            return _grammar_for(guide_type, guide)

    return on_compile_thread(convert)


def _check_size(guide: str) -> None:
    try:
        size = len(guide.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate, which no UTF-8 text can hold
        raise GuideError(f"the constraint is not valid Unicode: {exc.reason} at position {exc.start}") from None
    if size > MAX_GUIDE_BYTES:
        raise GuideError(f"the constraint is {size} bytes; the limit is {MAX_GUIDE_BYTES}")


def _grammar_for(guide_type: GuideType, guide: str | None) -> str:
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
    if guide_type is GuideType.STRUCTURAL_TAG:
        return str(LLMatcher.grammar_from_lark(structural_tag_grammar(_json_document(guide, "structural tag"))))
    if guide_type in (GuideType.EBNF_GRAMMAR, GuideType.LARK):
        _check_rules(guide, MAX_GBNF_RULES if guide_type is GuideType.EBNF_GRAMMAR else MAX_GRAMMAR_RULES)
    if guide_type is GuideType.EBNF_GRAMMAR:
        try:
            return str(llguidance.grammar_from("ebnf", guide))
        except Exception as exc:  # the GBNF converter raises plain exceptions on bad input
            raise GuideError(f"invalid EBNF grammar: {short(str(exc))}") from None
    return str(LLMatcher.grammar_from_lark(guide))


def check_grammar(grammar: str, tokenizer: llguidance.LLTokenizer | None = None) -> None:
    """Compile ``grammar`` (against ``tokenizer`` when given); raise :class:`GuideError` if it fails."""

    def validate() -> tuple[bool, list[str]]:
        with llguidance_panics_refused():
            return LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)

    is_error, messages = on_compile_thread(validate)
    if is_error:
        raise GuideError(short("; ".join(m.strip() for m in messages)) or "the grammar does not compile")
