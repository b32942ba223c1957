"""Structural tags: free text in which each trigger opens a structure (begin, JSON of its schema, end),
as the Llama 3.1 and the Hermes tool-call templates write them; the grammar agrees with what a
reader of those templates would accept, and a bad tag is refused saying why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llgtriton.guides import GuideError, check_grammar, grammar_for
from llgtriton.wire import GuideType
from tests.llgtriton.matching import accepts

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TZ = {
    "type": "object",
    "properties": {"tz": {"enum": ["UTC", "CET"]}},
    "required": ["tz"],
    "additionalProperties": False,
}

LLAMA = {  # Llama 3.1's custom tool calls: <function=name>{...}</function>
    "structures": [
        {"begin": "<function=get_weather>", "schema": CITY, "end": "</function>"},
        {"begin": "<function=get_time>", "schema": TZ, "end": "</function>"},
    ],
    "triggers": ["<function="],
}
HERMES = {  # Hermes / Qwen: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    "structures": [
        {"begin": '<tool_call>\n{"name": "get_weather", "arguments": ', "schema": CITY, "end": "}\n</tool_call>"},
        {"begin": '<tool_call>\n{"name": "get_time", "arguments": ', "schema": TZ, "end": "}\n</tool_call>"},
    ],
    "triggers": ["<tool_call>"],
}


def grammar(tag: dict[str, Any]) -> str:
    return grammar_for(GuideType.STRUCTURAL_TAG, json.dumps(tag))


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("", True),
        ("Just an answer, no call.", True),
        ('<function=get_weather>{"city":"Paris"}</function>', True),
        (
            'Let me look. <function=get_weather>{"city":"Paris"}</function>'
            ' and <function=get_time>{"tz":"UTC"}</function>',
            True,
        ),
        ('<function=get_weather>{"city":"Paris"}</function>\nIt is sunny.', True),
        ("Text that names <function= and stops.", False),  # a trigger opens a structure, always
        ('<function=get_weather>{"town":"Paris"}</function>', False),  # the schema holds
        ('<function=get_time>{"tz":"PST"}</function>', False),
        ('<function=get_weather>{"city":"Paris"}', False),  # unterminated
        ('<function=get_wether>{"city":"Paris"}</function>', False),  # no such structure
        ("a <function without its = sign is text", True),
    ],
)
def test_a_llama_style_tag(text: str, accepted: bool) -> None:
    assert accepts(grammar(LLAMA), text) is accepted


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("The weather is fine.", True),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}\n</tool_call>', True),
        ('Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"tz":"CET"}}\n</tool_call>\nDone.', True),
        ('<tool_call>\n{"name": "get_time", "arguments": {"city":"Oslo"}}\n</tool_call>', False),
        ('<tool_call>{"name": "get_weather", "arguments": {"city":"Oslo"}}</tool_call>', False),  # its layout
        ("I will not write <tool_call> here", False),
    ],
)
def test_a_hermes_style_tag(text: str, accepted: bool) -> None:
    assert accepts(grammar(HERMES), text) is accepted


@given(st.text(alphabet=st.sampled_from(list("ab <>=/fnctio_")), max_size=30))
def test_text_is_free_exactly_where_it_holds_no_trigger(text: str) -> None:
    assert accepts(grammar(LLAMA), text) is ("<function=" not in text)


@given(
    st.lists(st.tuples(st.text(alphabet="ab <", max_size=5), st.sampled_from(["Paris", "Oslo", 'a"b'])), max_size=3),
    st.text(alphabet="ab <", max_size=5),
)
def test_any_calls_between_any_free_text_are_accepted(calls: list[tuple[str, str]], tail: str) -> None:
    written = "".join(
        f"{text}<function=get_weather>{json.dumps({'city': city}, separators=(',', ':'))}</function>"
        for text, city in calls
    )
    assert accepts(grammar(LLAMA), written + tail)


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ([], "an object"),
        ({"structures": [], "triggers": ["<f"]}, "structures"),
        ({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}]}, "triggers"),
        ({"structures": [{"begin": "<g>", "schema": {}, "end": "</g>"}], "triggers": ["<f"]}, "starts with none"),
        ({"structures": [{"begin": "<f>", "schema": 3, "end": "</f>"}], "triggers": ["<f"]}, "schema"),
        ({"structures": [{"begin": "<f>", "schema": False, "end": "</f>"}], "triggers": ["<f"]}, "never be written"),
        ({"structures": [{"begin": "<f>", "schema": {"type": "nope"}, "end": "</f>"}], "triggers": ["<f"]}, "nope"),
    ],
)
def test_a_bad_tag_is_refused_saying_why(tag: Any, message: str) -> None:
    with pytest.raises(GuideError, match=message):
        check_grammar(grammar(tag))
