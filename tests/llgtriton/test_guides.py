"""llgtriton.guides: every constraint format compiles to an llguidance grammar, or fails with llguidance's message.

The token-level checks run the grammars with a real llguidance tokenizer (the 262-token byte
tokenizer), so they show what a constrained generation can and cannot produce.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import llguidance
import llguidance.numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher

from llgtriton.guides import (
    ANY_JSON_OBJECT,
    COMPACT_JSON,
    MAX_CONCURRENT_COMPILES,
    MAX_GUIDE_BYTES,
    MAX_JSON_INDENT,
    MAX_MESSAGE_CHARS,
    CompilerBusy,
    GuideError,
    check_grammar,
    choice_grammar,
    grammar_for,
    json_schema_grammar,
    llguidance_panics_refused,
    on_compile_thread,
    schema_depth,
    with_json_options,
)
from llgtriton.wire import GuideType
from tests.llgtriton.matching import BYTE_TOKENIZER, accepts, matcher


def compiled(guide_type: GuideType, guide: str | None) -> str:
    grammar = grammar_for(guide_type, guide)
    check_grammar(grammar)
    check_grammar(grammar, BYTE_TOKENIZER)
    return grammar


def guide_error(guide_type: GuideType, guide: str | None) -> str:
    """The message of the GuideError that compiling ``guide`` raises."""
    with pytest.raises(GuideError) as caught:
        check_grammar(grammar_for(guide_type, guide))
    message = str(caught.value)
    assert message
    return message


def test_the_byte_tokenizer() -> None:
    assert BYTE_TOKENIZER.vocab_size == 262
    assert BYTE_TOKENIZER.eos_token == 261
    assert BYTE_TOKENIZER.decode_str(BYTE_TOKENIZER.tokenize_str("{é}")) == "{é}"


# Good input: every guide type compiles, and the grammar means what the guide says -------------

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

GOOD: list[tuple[GuideType, str | None, list[str], list[str]]] = [
    (GuideType.JSON, None, ['{"a": 1}', "{}"], ["[]", "1", ""]),
    (GuideType.JSON, "", ['{"a": [1, 2]}'], ['"x"']),
    (GuideType.JSON, json.dumps(SCHEMA), ['{"name": "Ann", "age": 3}'], ['{"name": "Ann"}']),
    (
        GuideType.JSON_SCHEMA,
        json.dumps(SCHEMA),
        ['{"name": "Ann", "age": 3}', '{"name": "é\\"]}", "age": -40}'],
        ['{"name": "Ann"}', '{"name": "Ann", "age": 3.5}', '{"name": "Ann", "age": 3, "x": 1}'],
    ),
    (GuideType.JSON_SCHEMA, '{"type": "string", "maxLength": 3}', ['"abc"', '""'], ['"abcd"', "abc"]),
    (GuideType.REGEX, r"\d{3}-[a-z]+", ["123-abc", "000-z"], ["12-abc", "123-abc!", "123-", "x123-abc"]),
    (GuideType.REGEX, "(yes|no)", ["yes", "no"], ["yesno", "y", "maybe"]),
    (GuideType.EBNF_GRAMMAR, 'root ::= "yes" | "no" digit\ndigit ::= [0-9]', ["yes", "no7"], ["no", "yes7"]),
    (GuideType.LARK, 'start: "a" b+\nb: "b"', ["ab", "abbb"], ["a", "b", "abc"]),
    (GuideType.CHOICE, json.dumps(["yes", "no", 'a "quoted" \\ one', "é"]), ["yes", 'a "quoted" \\ one', "é"], []),
    (
        GuideType.STRUCTURAL_TAG,
        json.dumps(
            {"structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}], "triggers": ["<n"]}
        ),
        ["free text", "a <n>12</n> b", ""],
        ["a <n>x</n>", "a <n>1", "a <n"],
    ),
]


def test_every_guide_type_has_good_input() -> None:
    assert {guide_type for guide_type, *_ in GOOD} == set(GuideType)


@pytest.mark.parametrize(("guide_type", "guide", "accepted", "rejected"), GOOD)
def test_good_input_compiles_and_constrains(
    guide_type: GuideType, guide: str | None, accepted: list[str], rejected: list[str]
) -> None:
    grammar = compiled(guide_type, guide)
    for text in accepted:
        assert accepts(grammar, text), text
    for text in rejected:
        assert not accepts(grammar, text), text


def test_regex_is_a_full_match() -> None:
    grammar = compiled(GuideType.REGEX, "[a-c]+")
    assert accepts(grammar, "abcabc")
    assert not accepts(grammar, "abcd")
    assert not accepts(grammar, " abc")
    assert not accepts(grammar, "")


def test_regex_prefix_is_not_accepting_but_can_continue() -> None:
    built = matcher(compiled(GuideType.REGEX, r"\d{3}"))
    assert built.consume_tokens(BYTE_TOKENIZER.tokenize_str("12"))
    assert not built.is_accepting()
    assert built.consume_tokens(BYTE_TOKENIZER.tokenize_str("3"))
    assert built.is_accepting()


def test_choice_accepts_exactly_the_listed_strings() -> None:
    choices = ["red", "green", "greenish", "<b>", "a\nb", "日本"]
    grammar = compiled(GuideType.CHOICE, json.dumps(choices))
    for choice in choices:
        assert accepts(grammar, choice), choice
    for other in ["", "re", "gree", "redgreen", "red ", "Red", "greenishh", "<b", "a\\nb", "日"]:
        assert not accepts(grammar, other), other


def test_choice_quotes_each_choice() -> None:
    grammar = choice_grammar(["a", 'b"c', "d\\e"])
    assert [accepts(grammar, text) for text in ["a", 'b"c', "d\\e", "b", 'b"', "d"]] == [True] * 3 + [False] * 3


def test_choice_of_the_empty_string() -> None:
    grammar = compiled(GuideType.CHOICE, json.dumps(["", "x"]))
    assert accepts(grammar, "") and accepts(grammar, "x") and not accepts(grammar, "xx")


@pytest.mark.parametrize("count", [5000, 60_000])
def test_a_choice_beyond_the_earley_row_and_symbol_limits_generates(count: int) -> None:
    """As grammar rules, more than 2,000 branches fail at the first token and 65,000 symbols at
    compilation; as one lexeme, neither limit applies."""
    choices = [f"option-{i}" for i in range(count)]
    built = matcher(compiled(GuideType.CHOICE, json.dumps(choices)))
    mask = llguidance.numpy.allocate_token_bitmask(1, BYTE_TOKENIZER.vocab_size)
    llguidance.numpy.fill_next_token_bitmask(built, mask, 0)
    assert not built.is_error(), built.get_error()
    grammar = compiled(GuideType.CHOICE, json.dumps(choices))
    for text in ["option-0", f"option-{count - 1}", "option-123"]:
        assert accepts(grammar, text)
    assert not accepts(grammar, f"option-{count}")


def test_choices_nested_as_prefixes_are_refused_by_name() -> None:
    message = guide_error(GuideType.CHOICE, json.dumps(["a" * i for i in range(1, 1300)]))
    assert "prefixes" in message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.sampled_from('ab"\\é'), max_size=5), min_size=1, max_size=12), st.text("ab", max_size=5))
def test_choice_accepts_the_choices_and_nothing_else(choices: list[str], other: str) -> None:
    grammar = choice_grammar(choices)
    assert all(accepts(grammar, choice) for choice in choices)
    assert accepts(grammar, other) == (other in choices)


# JSON layout: bounded whitespace by default, compact on request ----------------------------------

LAYOUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}},
}
OBJECT = {"a": 1, "b": [1, 2]}


@pytest.mark.parametrize("guide_type", [GuideType.JSON, GuideType.JSON_SCHEMA])
def test_json_follows_the_layouts_a_prompt_shows(guide_type: GuideType) -> None:
    grammar = compiled(guide_type, json.dumps(LAYOUT_SCHEMA))
    for text in [
        json.dumps(OBJECT),
        json.dumps(OBJECT, separators=(",", ":")),
        json.dumps(OBJECT, indent=2),
        json.dumps(OBJECT, indent=4),
        json.dumps(OBJECT, indent="\t"),
        '{ "a": 1 }',
        '{"a" : 1}',
    ]:
        assert accepts(grammar, text), text


@pytest.mark.parametrize("guide_type", [GuideType.JSON, GuideType.JSON_SCHEMA])
def test_json_whitespace_is_bounded_so_a_model_cannot_loop_on_it(guide_type: GuideType) -> None:
    grammar = compiled(guide_type, json.dumps(LAYOUT_SCHEMA))
    for text in [
        '{"a":  1}',
        '{"a":\n\n1}',
        '{\n \n"a": 1}',
        "{\n" + " " * (MAX_JSON_INDENT + 1) + '"a": 1}',
        '{"a": 1}\n',
        '\n{"a": 1}',
        '{"a":\r1}',
    ]:
        assert not accepts(grammar, text), text
    assert accepts(grammar, "{\n" + " " * MAX_JSON_INDENT + '"a": 1}')


def test_compact_json_is_exactly_the_python_separators() -> None:
    grammar = compiled(GuideType.JSON_SCHEMA, json.dumps(with_json_options(LAYOUT_SCHEMA, COMPACT_JSON)))
    assert accepts(grammar, json.dumps(OBJECT))
    for text in [
        '{"a":1}',
        '{ "a": 1}',
        '{"a" : 1}',
        '{"a": 1,"b": [1, 2]}',
        '{\n"a": 1}',
        json.dumps(OBJECT, indent=2),
        json.dumps(OBJECT, separators=(",", ":")),
    ]:
        assert not accepts(grammar, text), text


def test_a_schemas_own_json_options_win() -> None:
    own = {**LAYOUT_SCHEMA, "x-guidance": {"whitespace_pattern": "[ ]{0,3}"}}
    merged = with_json_options(own, COMPACT_JSON)
    assert merged["x-guidance"]["whitespace_pattern"] == "[ ]{0,3}"
    assert merged["x-guidance"]["item_separator"] == ", "
    assert with_json_options(True, COMPACT_JSON) == {"x-guidance": COMPACT_JSON}
    assert with_json_options(False, COMPACT_JSON) is False
    assert own["x-guidance"] == {"whitespace_pattern": "[ ]{0,3}"}  # not changed in place


@pytest.mark.parametrize("guide", [None, ""])
def test_json_without_a_guide_is_any_json_object(guide: str | None) -> None:
    grammar = compiled(GuideType.JSON, guide)
    assert grammar == json_schema_grammar(ANY_JSON_OBJECT)
    for text in ["{}", '{"a": 1}', '{"a": [1, {"b": null}], "c": "x", "d": true, "e": -1.5e+10}', '{"": {}}']:
        assert accepts(grammar, text), text
    for text in ["[]", "[{}]", "1", '"x"', "null", "true", "", "{", '{"a": }', '{"a": 1}{}']:
        assert not accepts(grammar, text), text


# llguidance's JSON strings hold DEL only \u-escaped, which json.dumps never writes.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x7f"), max_size=8)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(TEXT, JSON_VALUES, max_size=4))
def test_any_object_written_by_json_dumps_is_accepted(value: dict[str, Any]) -> None:
    # llguidance writes non-ASCII characters raw (a \\u escape only for control characters), as
    # json.dumps does with ensure_ascii=False.
    grammar = json_schema_grammar(ANY_JSON_OBJECT)
    assert accepts(grammar, json.dumps(value, ensure_ascii=False))


# Boolean schemas ----------------------------------------------------------------------------


@pytest.mark.parametrize("schema", [True, "true"])
def test_true_schema_accepts_any_json(schema: bool | str) -> None:
    grammar = json_schema_grammar(True) if schema is True else compiled(GuideType.JSON_SCHEMA, "true")
    check_grammar(grammar)
    for text in ["1", '"x"', "null", "[1, {}]", '{"a": [true]}']:
        assert accepts(grammar, text), text
    assert not accepts(grammar, "[1,  2]")  # the server's JSON layout holds


def test_false_schema_is_refused() -> None:
    # Nothing satisfies a false schema, so no generation could follow it.
    with pytest.raises(GuideError):
        check_grammar(json_schema_grammar(False))
    guide_error(GuideType.JSON_SCHEMA, "false")


# Bad input: GuideError with llguidance's message --------------------------------------------


@pytest.mark.parametrize(
    ("regex", "problem"),
    [
        ("(abc", "unclosed group"),
        ("[a-", "unclosed character class"),
        ("a{2,1}", "invalid repetition count range"),
        ("x{", "repetition"),
    ],
)
def test_invalid_regex_names_the_problem(regex: str, problem: str) -> None:
    message = guide_error(GuideType.REGEX, regex)
    assert "invalid regex" in message
    assert regex in message
    assert problem in message


def test_unknown_lark_rule() -> None:
    message = guide_error(GuideType.LARK, "start: greeting")
    assert 'unknown name: "greeting"' in message


@pytest.mark.parametrize("lark", ['start: "a', "start", 'root ::= "a"', "start: /[/"])
def test_invalid_lark(lark: str) -> None:
    guide_error(GuideType.LARK, lark)


def test_invalid_ebnf() -> None:
    assert "invalid EBNF grammar" in guide_error(GuideType.EBNF_GRAMMAR, "root ::= (")


@pytest.mark.parametrize("guide_type", [GuideType.JSON, GuideType.JSON_SCHEMA])
@pytest.mark.parametrize("guide", ["{not json", "{'type': 'object'}", '{"type": "object"', "nope"])
def test_json_schema_that_is_not_json(guide_type: GuideType, guide: str) -> None:
    message = guide_error(guide_type, guide)
    assert "the JSON schema is not valid JSON" in message


@pytest.mark.parametrize("guide", ["[1]", '"object"', "3", "null"])
def test_json_schema_that_is_neither_an_object_nor_a_boolean(guide: str) -> None:
    assert "must be an object or a boolean" in guide_error(GuideType.JSON_SCHEMA, guide)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "foo"}, "Invalid type: foo"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "/nowhere"),
        ({"type": "object", "not": {"pattern": "^a"}}, "Unimplemented keys"),  # no exact complement
    ],
)
def test_unsupported_json_schema_has_llguidance_message(schema: dict[str, Any], problem: str) -> None:
    assert problem in guide_error(GuideType.JSON_SCHEMA, json.dumps(schema))


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1])
def test_json_schema_with_an_integer_beyond_64_bits_is_refused(number: int) -> None:
    """Found by schemathesis: llguidance cannot serialise such a number, which used to be a 500."""
    message = guide_error(GuideType.JSON_SCHEMA, json.dumps({"type": "integer", "maximum": number}))
    assert "the JSON schema cannot be used" in message


@pytest.mark.parametrize("guide", ['"yes"', "[1, 2]", '["a", 2]', "[]", '{"a": "b"}', "[null]", "[[]]"])
def test_choice_that_is_not_a_list_of_strings(guide: str) -> None:
    assert guide_error(GuideType.CHOICE, guide) == "a choice constraint is a non-empty list of strings"


def test_choice_that_is_not_json() -> None:
    assert "the choice list is not valid JSON" in guide_error(GuideType.CHOICE, "[yes, no]")


@pytest.mark.parametrize(
    "guide_type", [GuideType.REGEX, GuideType.JSON_SCHEMA, GuideType.LARK, GuideType.EBNF_GRAMMAR, GuideType.CHOICE]
)
@pytest.mark.parametrize("guide", [None, ""])
def test_empty_guide(guide_type: GuideType, guide: str | None) -> None:
    assert guide_error(guide_type, guide) == f"guide type {guide_type.value!r} needs a guide"


def test_guide_at_the_size_limit_is_accepted() -> None:
    schema = '{"type": "object"}'
    guide = schema + " " * (MAX_GUIDE_BYTES - len(schema))
    assert len(guide.encode()) == MAX_GUIDE_BYTES
    compiled(GuideType.JSON_SCHEMA, guide)


@pytest.mark.parametrize("guide_type", list(GuideType))
def test_guide_over_the_size_limit(guide_type: GuideType) -> None:
    guide = "a" * (MAX_GUIDE_BYTES + 1)
    message = guide_error(guide_type, guide)
    assert message == f"the constraint is {MAX_GUIDE_BYTES + 1} bytes; the limit is {MAX_GUIDE_BYTES}"


def test_guide_size_limit_counts_utf8_bytes() -> None:
    guide = json.dumps(["é" * (MAX_GUIDE_BYTES // 2)], ensure_ascii=False)
    assert len(guide) <= MAX_GUIDE_BYTES < len(guide.encode())
    assert "bytes; the limit is" in guide_error(GuideType.CHOICE, guide)


def test_check_grammar_reports_llguidance_message() -> None:
    grammar = LLMatcher.grammar_from_regex("(")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    assert is_error
    with pytest.raises(GuideError) as caught:
        check_grammar(grammar)
    assert str(caught.value) == "; ".join(m.strip() for m in messages)


def test_guide_error_is_a_value_error() -> None:
    assert issubclass(GuideError, ValueError)


# Random regexes: llguidance's language is Python's on this fragment -----------------------------

REGEX_ATOMS = st.sampled_from(["a", "b", "c", "x", "[a-c]", "[0-9]", "[^a-y]", ".", r"\d", r"\.", "é"])
REGEXES = st.recursive(
    REGEX_ATOMS,
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda pair: f"(?:{pair[0]}|{pair[1]})"),
        st.tuples(inner, st.sampled_from(["?", "*", "+", "{2}", "{0,3}", "{1,}"])).map(
            lambda pair: f"(?:{pair[0]}){pair[1]}"
        ),
    ),
    max_leaves=8,
)
SUBJECTS = st.text(alphabet="abcxyé0.9\n", max_size=8)


@given(REGEXES, st.data())
@settings(max_examples=60, deadline=None)
def test_random_regexes_match_what_python_matches(regex: str, data: st.DataObject) -> None:
    """Strings the regex fully matches are produced; random strings are produced only if they match."""
    grammar = compiled(GuideType.REGEX, regex)
    member = data.draw(st.from_regex(regex, fullmatch=True).filter(lambda s: "\n" not in s), label="member")
    assert accepts(grammar, member), (regex, member)
    subject = data.draw(SUBJECTS, label="subject")
    assert accepts(grammar, subject) == (re.fullmatch(regex, subject) is not None), (regex, subject)


class PanicException(BaseException):
    """Named like pyo3's: what llguidance raises when its Rust code panics."""


def test_a_panic_inside_llguidance_refuses_the_constraint_and_other_exits_pass() -> None:
    with pytest.raises(GuideError, match="could not process"), llguidance_panics_refused():
        raise PanicException("end byte index 100 is not a char boundary")
    with pytest.raises(KeyboardInterrupt), llguidance_panics_refused():
        raise KeyboardInterrupt


# Hostile constraints: deep native recursion, slow compiles --------------------------------------


def ref_chain(depth: int) -> dict[str, Any]:
    """A schema whose $refs chain ``depth`` deep: llguidance recurses once per link."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(depth)}
    return {"$defs": {**defs, f"d{depth}": {"type": "integer"}}, "$ref": "#/$defs/d0"}


LARK_CHAIN = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(3000)) + 'r3000: "b"\n'


@pytest.mark.parametrize(
    ("guide_type", "guide", "match"),
    [
        (GuideType.JSON_SCHEMA, json.dumps(ref_chain(1500)), "deeper than 256 levels"),  # overflowed 8 MiB: SIGSEGV
        (GuideType.JSON_SCHEMA, json.dumps(ref_chain(12000)), "deeper than 256 levels"),  # about MAX_GUIDE_BYTES
        (GuideType.LARK, LARK_CHAIN, "rules; the limit is 2000"),
        (
            GuideType.EBNF_GRAMMAR,
            "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(600)),
            "limit is 500",
        ),
    ],
    ids=["refs-1500", "refs-12000", "lark-rules-3000", "gbnf-rules-600"],
)
def test_deeply_chained_constraints_are_refused_by_their_bounds(guide_type: GuideType, guide: str, match: str) -> None:
    assert len(guide.encode()) <= MAX_GUIDE_BYTES
    assert match in guide_error(guide_type, guide)


def test_the_compilers_survive_chains_beyond_their_bounds() -> None:
    """The bounds are a second line: on the compile thread's stack llguidance takes what overflowed 8 MiB."""
    grammar = on_compile_thread(lambda: str(LLMatcher.grammar_from_json_schema(ref_chain(1500))))
    check_grammar(grammar, BYTE_TOKENIZER)
    check_grammar(LARK_CHAIN, BYTE_TOKENIZER)


def test_recursive_schemas_are_not_too_deep() -> None:
    tree = {
        "$defs": {
            "node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
        },
        "$ref": "#/$defs/node",
    }
    compiled(GuideType.JSON_SCHEMA, json.dumps(tree))
    assert schema_depth(tree) < 10


def test_schema_depth_counts_nesting_and_followed_refs() -> None:
    assert schema_depth({"type": "integer"}) == 1
    assert schema_depth({"properties": {"a": {"type": "integer"}}}) == 3
    assert schema_depth(ref_chain(10)) == schema_depth(ref_chain(9)) + 2  # an array and its items per link
    with pytest.raises(GuideError, match="deeper than 5 levels"):
        schema_depth(ref_chain(10), limit=5)


def test_a_compile_that_takes_too_long_is_refused() -> None:
    release = threading.Event()
    try:
        with pytest.raises(GuideError, match=r"did not compile within 0\.1 s"):
            on_compile_thread(lambda: release.wait(30), timeout_s=0.1)
    finally:
        release.set()


def test_compiles_beyond_the_concurrency_bound_are_told_to_come_back() -> None:
    release = threading.Event()
    try:
        for _ in range(MAX_CONCURRENT_COMPILES):  # each outlives its wait and keeps its slot
            with pytest.raises(GuideError):  # (1 s: time for a slot an earlier test's compile still holds)
                on_compile_thread(lambda: release.wait(30), timeout_s=1.0)
        with pytest.raises(CompilerBusy):
            on_compile_thread(lambda: None, timeout_s=0.1)
    finally:
        release.set()
    assert on_compile_thread(lambda: 42, timeout_s=5) == 42  # the slots free as the slow ones end


def test_compile_errors_travel_back_to_the_caller() -> None:
    def broken() -> None:
        raise GuideError("nope")

    with pytest.raises(GuideError, match="nope"):
        on_compile_thread(broken)


@pytest.mark.parametrize("guide_type", [GuideType.REGEX, GuideType.LARK, GuideType.JSON_SCHEMA])
def test_a_lone_surrogate_is_refused_by_name(guide_type: GuideType) -> None:
    assert "not valid Unicode" in guide_error(guide_type, '"\ud800"')


def test_long_llguidance_messages_are_cut() -> None:
    message = guide_error(GuideType.LARK, "start: " + "x " * 100_000)
    assert len(message) <= MAX_MESSAGE_CHARS + 10
