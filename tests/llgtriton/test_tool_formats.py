"""llgtriton.tool_formats and llgtriton.tools: each family's call syntax, constrained and written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llgtriton.guides import grammar_for, lark_text
from llgtriton.tool_formats import FORMATS, detect_format, renders_tools
from llgtriton.tools import Function, PastCall, ToolMode, ToolRequest
from llgtriton.wire import GuideType
from tests.llgtriton.matching import accepts

WEATHER = Function(
    "get_weather",
    "The weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
)
TIME = Function(
    "get_time",
    "",
    {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"], "additionalProperties": False},
)
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
UTC = {"name": "get_time", "arguments": {"tz": "UTC"}}


def hermes_calls(*calls: dict[str, Any]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)


def grammar(form: str, mode: ToolMode, parallel: bool = True, answer: str | None = None) -> str:
    functions = (WEATHER,) if mode is ToolMode.NAMED else (WEATHER, TIME)
    return grammar_for(GuideType.LARK, FORMATS[form].grammar(ToolRequest(functions, mode, parallel), answer))


def test_hermes_required_is_one_or_more_tagged_calls_each_checked_against_its_schema() -> None:
    required = grammar("hermes", ToolMode.REQUIRED)
    assert accepts(required, hermes_calls(PARIS))
    assert accepts(required, hermes_calls(PARIS, UTC))
    assert not accepts(required, "")
    assert not accepts(required, "It is sunny.")
    assert not accepts(required, hermes_calls({"name": "get_weather", "arguments": {"town": "Paris"}}))
    assert not accepts(required, hermes_calls({"name": "get_stock", "arguments": {}}))
    assert not accepts(required, json.dumps([PARIS]))  # our own list is not this family's syntax


def test_hermes_without_parallel_calls_is_exactly_one_call() -> None:
    one = grammar("hermes", ToolMode.REQUIRED, parallel=False)
    assert accepts(one, hermes_calls(PARIS))
    assert not accepts(one, hermes_calls(PARIS, UTC))


def test_hermes_auto_is_text_then_calls_from_the_trigger_on() -> None:
    auto = grammar("hermes", ToolMode.AUTO)
    assert accepts(auto, "It is sunny.")
    assert accepts(auto, hermes_calls(PARIS, UTC))
    assert accepts(auto, "Let me check.\n" + hermes_calls(PARIS))
    assert not accepts(auto, "<tool_call>\n{not json}\n</tool_call>")
    assert not accepts(auto, "Let me check. <tool_call> and more text")  # the trigger begins calls, always
    assert not accepts(grammar("hermes", ToolMode.AUTO, parallel=False), "Hm. " + hermes_calls(PARIS, UTC))


def test_auto_with_a_json_answer_is_that_answer_or_calls() -> None:
    answer = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    for form, calls in (("hermes", hermes_calls(PARIS)), ("generic", "<tool_call>" + json.dumps([PARIS]))):
        auto = grammar(form, ToolMode.AUTO, answer=answer)
        assert accepts(auto, '{"n": 4}')
        assert accepts(auto, calls)
        assert not accepts(auto, "Four.")


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_a_named_function_is_its_bare_arguments_in_every_format(form: str) -> None:
    named = grammar(form, ToolMode.NAMED)
    assert accepts(named, '{"city": "Paris"}')
    assert not accepts(named, hermes_calls(PARIS))


def test_generic_required_is_a_json_list_of_calls() -> None:
    required = grammar("generic", ToolMode.REQUIRED, parallel=False)
    assert accepts(required, json.dumps([PARIS]))
    assert not accepts(required, json.dumps([PARIS, UTC]))


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_earlier_calls_are_written_as_the_format_constrains_them(form: str) -> None:
    calls = (PastCall("get_weather", '{"city": "Paris"}', "call_1"), PastCall("get_time", '{"tz": "UTC"}'))
    written = FORMATS[form].write(calls)
    assert accepts(grammar(form, ToolMode.AUTO), written)


def test_the_format_is_detected_from_the_template() -> None:
    hermes = "{% if tools %}<tools>{{ tools | tojson }}</tools> <tool_call>...</tool_call>{% endif %}"
    assert detect_format(hermes) is FORMATS["hermes"]
    assert renders_tools(hermes)
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert detect_format(plain) is FORMATS["generic"]
    assert not renders_tools(plain)
    assert detect_format(None) is FORMATS["generic"]


def test_the_instructions_name_the_functions_and_the_formats_syntax() -> None:
    tools = ToolRequest((WEATHER, TIME), ToolMode.AUTO)
    generic = FORMATS["generic"].instructions(tools)
    assert "get_weather" in generic and "The weather in a city" in generic and "get_time" in generic
    assert "<tool_call> followed by a JSON list" in generic and generic.endswith("otherwise reply normally.")
    assert FORMATS["generic"].instructions(tools, json_answer=True).endswith("otherwise reply with the JSON answer.")
    assert "</tool_call>" in FORMATS["hermes"].instructions(tools)
    named = FORMATS["hermes"].instructions(ToolRequest((WEATHER,), ToolMode.NAMED, False))
    assert named.endswith("Reply with the JSON arguments for get_weather.")


def test_a_tool_request_travels_as_json() -> None:
    tools = ToolRequest((WEATHER, TIME), ToolMode.REQUIRED, parallel=False)
    assert ToolRequest.from_json(tools.to_json()) == tools
    assert tools.openai_tools()[0] == {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER.parameters},
    }


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ("not json", "tools must be JSON"),
        ('{"functions": [], "mode": "auto"}', "at least one function"),
        ('{"functions": [{"name": "f"}], "mode": "sometimes"}', "tools must be JSON"),
        ('{"functions": [{"name": "f"}, {"name": "g"}], "mode": "named"}', "exactly that one function"),
    ],
)
def test_a_bad_tool_request_is_refused(payload: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ToolRequest.from_json(payload)


def llama_calls(*calls: dict[str, Any]) -> str:
    return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)


def test_llama3_json_is_bare_objects_with_parameters() -> None:
    required = grammar("llama3_json", ToolMode.REQUIRED)
    assert accepts(required, llama_calls(PARIS))
    assert accepts(required, llama_calls(PARIS, UTC))
    assert not accepts(required, json.dumps(PARIS))  # "arguments" is not this family's key
    assert not accepts(grammar("llama3_json", ToolMode.REQUIRED, parallel=False), llama_calls(PARIS, UTC))
    auto = grammar("llama3_json", ToolMode.AUTO)
    assert accepts(auto, "It is sunny.")
    assert accepts(auto, llama_calls(UTC))
    assert not accepts(auto, "{not a call")


def test_a_llama_template_is_detected() -> None:
    llama = '{% if tools %}{{ tools | tojson }} Respond as {"name": ..., "parameters": ...}<|eom_id|>{% endif %}'
    assert detect_format(llama) is FORMATS["llama3_json"]
    assert detect_format("{% if tools %}{{ tools | tojson }}<|python_tag|>{% endif %}") is FORMATS["llama3_json"]


def mistral_calls(*calls: dict[str, Any]) -> str:
    return "[TOOL_CALLS]" + json.dumps(list(calls))


def test_mistral_calls_are_its_trigger_and_a_list_forced_or_not() -> None:
    for mode in (ToolMode.REQUIRED, ToolMode.AUTO):
        assert accepts(grammar("mistral", mode), mistral_calls(PARIS, UTC))
    assert not accepts(grammar("mistral", ToolMode.REQUIRED), json.dumps([PARIS]))  # its models write the trigger
    assert not accepts(grammar("mistral", ToolMode.REQUIRED, parallel=False), mistral_calls(PARIS, UTC))
    auto = grammar("mistral", ToolMode.AUTO)
    assert accepts(auto, "It is sunny.")
    assert accepts(auto, "Let me check. " + mistral_calls(PARIS))
    assert not accepts(auto, "[TOOL_CALLS] sunny")
    assert detect_format('{{ "[AVAILABLE_TOOLS]" + (tools | tojson) }}[TOOL_CALLS]') is FORMATS["mistral"]
    assert "Reply with [TOOL_CALLS] followed by a JSON list" in FORMATS["mistral"].instructions(
        ToolRequest((WEATHER,), ToolMode.REQUIRED)
    )


@pytest.mark.parametrize("call_id", ["call_0123456789abcdef", "x", "", "ünï-cödé_id"])
def test_mistral_templates_get_nine_letter_ids_the_same_for_a_call_and_its_result(call_id: str) -> None:
    mapped = FORMATS["mistral"].template_call_id(call_id)
    assert mapped is not None and len(mapped) == 9 and mapped.isascii() and mapped.isalnum()
    assert FORMATS["mistral"].template_call_id(call_id) == mapped
    assert FORMATS["mistral"].template_call_id("abcDEF123") == "abcDEF123"  # already of the shape: kept
    assert FORMATS["hermes"].template_call_id(call_id) == call_id


def test_tags_that_are_special_tokens_are_named_as_tokens() -> None:
    assert lark_text("<tool_call>\n", {"<tool_call>": 7}) == '<[7]> "\\n"'
    assert lark_text("\n</tool_call>", {"</tool_call>": 8, "<tool_call>": 7}) == '"\\n" <[8]>'
    assert lark_text("plain", {"<tool_call>": 7}) == '"plain"'
    special = {"[TOOL_CALLS]": 5}
    assert "<[5]>" in FORMATS["mistral"].grammar(ToolRequest((WEATHER,), ToolMode.AUTO), special=special)
    llama = FORMATS["llama3_json"]
    assert "<[128010]>?" in llama.grammar(ToolRequest((WEATHER,), ToolMode.REQUIRED), special={llama.marker: 128010})
    assert "<[" not in llama.grammar(ToolRequest((WEATHER,), ToolMode.REQUIRED))  # a tokenizer without the marker
