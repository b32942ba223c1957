"""proxy.tools and proxy.tool_calls: tool plans and their grammars, reading calls whole and streamed."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llgtriton.guides import check_grammar, grammar_for
from llgtriton.tool_formats import FORMATS, ToolCallFormat
from llgtriton.tools import ToolMode
from llgtriton.wire import GuideType
from proxy.errors import InvalidRequestError, validation_error
from proxy.protocol import MAX_TOOLS, ChatCompletionRequest, ChatDelta
from proxy.tool_calls import JsonArraySplitter, ParsedCall, ReadAnswer, ToolCallStream, read_answer
from proxy.tools import ToolPlan, plan_tools
from tests.llgtriton.matching import accepts

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_PARAMETERS},
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
TOOL_CALL_MARKER = "<tool_call>"  # our own format's trigger
NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}

PARIS = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
TWO_CALLS = (
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]'
)


def planned(tools: Any, tool_choice: Any, parallel: bool | None) -> ToolPlan | None:
    """plan_tools on a chat request carrying these fields, parsed as the proxy parses it."""
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": tool_choice}
        | {"parallel_tool_calls": parallel}
    )
    return plan_tools(request.tools, request.tool_choice, request.parallel_tool_calls)


def plan(tool_choice: Any, parallel: bool | None = None, tools: list[dict[str, Any]] | None = None) -> ToolPlan:
    made = planned(TOOLS if tools is None else tools, tool_choice, parallel)
    assert made is not None
    return made


def grammar(made: ToolPlan) -> str:
    """The grammar of the plan's tools as the backend builds it for a model whose chat template has no
    tools section (our generic format), compiled by llguidance."""
    compiled = grammar_for(GuideType.LARK, FORMATS["generic"].grammar(made.request))
    check_grammar(compiled)
    return compiled


def refused(tools: Any, tool_choice: Any = None, parallel: bool | None = None) -> InvalidRequestError:
    """The 400 the proxy answers: from parsing the request, or from planning its tools."""
    try:
        planned(tools, tool_choice, parallel)
    except ValidationError as exc:
        error = validation_error(exc)
    except InvalidRequestError as exc:
        error = exc
    else:
        raise AssertionError("the tools were accepted")
    assert error.status == 400
    assert error.message
    return error


# plan_tools ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tools", [None, []])
@pytest.mark.parametrize("tool_choice", [None, "none", "auto"])
def test_no_tools_no_plan(tools: list[dict[str, Any]] | None, tool_choice: str | None) -> None:
    assert planned(tools, tool_choice, None) is None
    assert planned(tools, tool_choice, False) is None


@pytest.mark.parametrize("tools", [None, []])
@pytest.mark.parametrize("tool_choice", ["required", NAMED_WEATHER])
def test_tool_choice_without_tools_is_a_400(tools: list[dict[str, Any]] | None, tool_choice: Any) -> None:
    assert refused(tools, tool_choice).param == "tool_choice"


def test_tool_choice_none_means_no_plan() -> None:
    assert planned(TOOLS, "none", None) is None
    assert planned(TOOLS, "none", False) is None


@pytest.mark.parametrize("tool_choice", [None, "auto"])
def test_auto_is_the_default_with_tools(tool_choice: str | None) -> None:
    made = plan(tool_choice)
    assert made.mode is ToolMode.AUTO
    assert made.request.parallel is True
    assert [f.name for f in made.functions] == ["get_weather", "get_time"]
    assert [f.description for f in made.functions] == ["The weather in a city", ""]
    assert accepts(grammar(made), "It is sunny.")
    assert accepts(grammar(made), TOOL_CALL_MARKER + TWO_CALLS)


@pytest.mark.parametrize(("parallel", "most"), [(None, None), (True, None), (False, 1)])
def test_required_plan(parallel: bool | None, most: int | None) -> None:
    made = plan("required", parallel)
    assert made.mode is ToolMode.REQUIRED
    assert made.request.parallel is (parallel is not False)
    assert accepts(grammar(made), PARIS)
    assert accepts(grammar(made), TWO_CALLS) is (most is None)
    assert not accepts(grammar(made), "[]")
    assert not accepts(grammar(made), '[{"name": "get_weather", "arguments": {"city": "Paris", "extra": 1}}]')
    assert not accepts(grammar(made), "It is sunny.")


def test_named_plan() -> None:
    made = plan(NAMED_WEATHER)
    assert made.mode is ToolMode.NAMED
    assert [f.name for f in made.functions] == ["get_weather"]
    assert made.functions[0].parameters == WEATHER_PARAMETERS
    assert accepts(grammar(made), '{"city": "Paris"}')
    assert not accepts(grammar(made), PARIS)


def test_function_without_parameters_takes_an_empty_object() -> None:
    bare = {"type": "function", "function": {"name": "ping"}}
    made = plan({"type": "function", "function": {"name": "ping"}}, tools=[bare])
    assert made.functions[0].parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert made.functions[0].description == ""
    assert accepts(grammar(made), "{}")


def test_unknown_named_function() -> None:
    error = refused(TOOLS, {"type": "function", "function": {"name": "get_stock"}})
    assert error.param == "tool_choice"
    assert "get_stock" in error.message


@pytest.mark.parametrize(
    "tool_choice",
    ["always", "", 5, {"type": "function"}, {"type": "function", "function": "get_weather"}, {"name": "get_weather"}],
)
def test_malformed_tool_choice(tool_choice: Any) -> None:
    assert refused(TOOLS, tool_choice).param == "tool_choice"


@pytest.mark.parametrize("name", ["", "has space", "a" * 65, "é", "dot.name", None, 5, ["x"]])
def test_bad_function_names(name: Any) -> None:
    tools = [WEATHER, {"type": "function", "function": {"name": name}}]
    assert refused(tools).param == "tools.1.function.name"


@pytest.mark.parametrize("name", ["a", "A-b_9", "x" * 64])
def test_good_function_names(name: str) -> None:
    assert plan(None, tools=[{"type": "function", "function": {"name": name}}]).functions[0].name == name


def test_duplicate_function_names() -> None:
    assert refused([WEATHER, TIME, WEATHER]).param == "tools"


def test_too_many_tools() -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]
    error = refused(tools, "required")
    assert error.param == "tools"
    assert str(MAX_TOOLS) in error.message
    assert len(plan("required", tools=tools[:MAX_TOOLS]).functions) == MAX_TOOLS


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "code_interpreter"},
        {"type": "custom", "custom": {"name": "x"}},
        {"type": "function"},
        {"type": "function", "function": "get_weather"},
        {"function": {"name": "get_weather"}},
    ],
)
def test_non_function_tools(tool: dict[str, Any]) -> None:
    assert str(refused([WEATHER, tool]).param).startswith("tools.1")  # the field at fault, or the tool


@pytest.mark.parametrize("parameters", [[], "object", 3])
def test_parameters_must_be_an_object(parameters: Any) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    assert refused([tool]).param == "tools.0.function.parameters"


# The grammars, run with a real tokenizer ----------------------------------------------------


@pytest.mark.parametrize("parallel", [None, True, False])
def test_required_grammar_enforces_names_and_parameters(parallel: bool | None) -> None:
    compiled = grammar(plan("required", parallel))
    assert accepts(compiled, PARIS)
    assert accepts(compiled, '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}]')
    assert accepts(compiled, '[{"name": "get_time", "arguments": {"tz": "UTC"}}]')
    for text in [
        '[{"name": "get_wether", "arguments": {"city": "Paris"}}]',
        '[{"name": "get_weather", "arguments": {}}]',
        '[{"name": "get_weather", "arguments": {"city": 5}}]',
        '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "K"}}]',
        '[{"name": "get_weather", "arguments": {"city": "Paris", "country": "FR"}}]',
        '[{"name": "get_time", "arguments": {"city": "Paris"}}]',
        '[{"name": "get_weather"}]',
        "[]",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        TOOL_CALL_MARKER + PARIS,
        "Paris",
    ]:
        assert not accepts(compiled, text), text
    assert accepts(compiled, TWO_CALLS) is (parallel is not False)


def test_named_grammar_is_the_parameter_schema() -> None:
    compiled = grammar(plan(NAMED_WEATHER))
    assert accepts(compiled, '{"city": "Paris"}')
    assert accepts(compiled, '{"city": "Paris", "unit": "F"}')
    assert accepts(compiled, '{"city":"Paris"}')
    for text in ["{}", '{"city": 1}', PARIS, '{"tz": "UTC"}', "Paris"]:
        assert not accepts(compiled, text), text


@pytest.mark.parametrize("parallel", [None, False])
def test_auto_grammar(parallel: bool | None) -> None:
    compiled = grammar(plan("auto", parallel))
    for text in ["Hello!", "It is sunny.\nTake <b>no</b> umbrella.", "x", "[not a call", "a <tool_call", ""]:
        assert accepts(compiled, text), text
    assert accepts(compiled, TOOL_CALL_MARKER + PARIS)
    assert accepts(compiled, "Let me check. " + TOOL_CALL_MARKER + PARIS)  # text, then calls
    assert not accepts(compiled, "a <tool_call> later")  # the trigger begins calls, always
    assert accepts(compiled, TOOL_CALL_MARKER + TWO_CALLS) is (parallel is None)
    for text in [
        TOOL_CALL_MARKER + '[{"name": "get_wether", "arguments": {"city": "Paris"}}]',
        TOOL_CALL_MARKER + '[{"name": "get_weather", "arguments": {}}]',
        TOOL_CALL_MARKER + "[]",
        TOOL_CALL_MARKER + "Paris",
        TOOL_CALL_MARKER + " " + PARIS,
        TOOL_CALL_MARKER,
    ]:
        assert not accepts(compiled, text), text


# parse_calls --------------------------------------------------------------------------------


def parse_calls(made: ToolPlan, text: str, form: ToolCallFormat = FORMATS["generic"]) -> list[ParsedCall] | None:
    """The calls of a finished output (None: it holds no call syntax)."""
    return read_answer(made, text, form).calls


def calls_of(parsed: list[ParsedCall] | None) -> list[tuple[str, Any]] | None:
    return None if parsed is None else [(c.name, json.loads(c.arguments)) for c in parsed]


def test_parse_named() -> None:
    parsed = parse_calls(plan(NAMED_WEATHER), '{"city": "Paris"}')
    assert parsed is not None
    assert [(c.name, c.arguments) for c in parsed] == [("get_weather", '{"city": "Paris"}')]
    assert parsed[0].id.startswith("call_")
    # A named call is the arguments text as written, even cut short.
    truncated = parse_calls(plan(NAMED_WEATHER), '{"city": "Pa')
    assert truncated is not None
    assert [(c.name, c.arguments) for c in truncated] == [("get_weather", '{"city": "Pa')]
    assert parse_calls(plan(NAMED_WEATHER), "") == []


@pytest.mark.parametrize(("mode", "prefix"), [("required", ""), ("auto", TOOL_CALL_MARKER)])
def test_parse_call_lists(mode: str, prefix: str) -> None:
    made = plan(mode)
    assert calls_of(parse_calls(made, prefix + PARIS)) == [("get_weather", {"city": "Paris"})]
    two = parse_calls(made, prefix + TWO_CALLS)
    assert calls_of(two) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]
    assert two is not None
    assert two[0].id != two[1].id
    assert all(c.id.startswith("call_") for c in two)
    unicode = parse_calls(made, prefix + '[{"name": "get_weather", "arguments": {"city": "Z\\u00fcrich"}}]')
    assert unicode is not None
    assert unicode[0].arguments == '{"city": "Z\\u00fcrich"}'  # the arguments as the model wrote them
    compact = parse_calls(made, prefix + '[{"name":"get_weather","arguments":{"city":"Paris","unit":"C"}}]')
    assert compact is not None
    assert compact[0].arguments == '{"city":"Paris","unit":"C"}'


@pytest.mark.parametrize(("mode", "prefix"), [("required", ""), ("auto", TOOL_CALL_MARKER)])
@pytest.mark.parametrize(
    "text", ["", "[", "[]", "{}", '[{"na', '[{"name": "', '[{"arguments": {}}]', "[1, 2]", "not json"]
)
def test_call_syntax_without_a_call_is_no_call(mode: str, prefix: str, text: str) -> None:
    assert parse_calls(plan(mode), prefix + text) == []


@pytest.mark.parametrize(("mode", "prefix"), [("required", ""), ("auto", TOOL_CALL_MARKER)])
def test_a_list_cut_short_keeps_its_complete_calls(mode: str, prefix: str) -> None:
    whole = calls_of(parse_calls(plan(mode), prefix + TWO_CALLS))
    assert whole is not None
    for cut in (TWO_CALLS[: len(PARIS) + 5], PARIS[:-1]):
        assert calls_of(parse_calls(plan(mode), prefix + cut)) == whole[:1]


@pytest.mark.parametrize(("mode", "prefix"), [("required", ""), ("auto", TOOL_CALL_MARKER)])
@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        ('[{"name": "get_weather", "arguments": {"city": "Pa', [("get_weather", '{"city": "Pa')]),
        ('[{"name": "get_weather", "arguments": {"city": "Paris"}', [("get_weather", '{"city": "Paris"}')]),
        ('[{"name": "get_weather", "arguments": ', [("get_weather", "")]),
        ('[{"name": "get_weather"', [("get_weather", "")]),
        ('[{"name": "get_w', [("get_weather", "")]),  # only one function's name starts so
        ('[{"name": "get_', []),  # get_weather or get_time
        (TWO_CALLS[: len(PARIS) + 30], [("get_weather", '{"city": "Paris"}'), ("get_time", "")]),
    ],
)
def test_a_call_cut_short_is_a_call_with_the_arguments_so_far(
    mode: str, prefix: str, cut: str, expected: list[tuple[str, str]]
) -> None:
    parsed = parse_calls(plan(mode), prefix + cut)
    assert parsed is not None
    assert [(c.name, c.arguments) for c in parsed] == expected
    _, result = stream(plan(mode), [prefix + cut[:7], cut[7:]])
    assert (result.content, named_and_arguments(result.calls)) == ("", expected)


def test_parse_keeps_only_well_formed_calls() -> None:
    text = '[{"name": "get_time", "arguments": {"tz": "UTC"}}, {"nope": 1}, 3]'
    assert calls_of(parse_calls(plan("required"), text)) == [("get_time", {"tz": "UTC"})]


@pytest.mark.parametrize("text", ["Hello", PARIS, "<b>", "<tool_calls>"])
def test_parse_auto_plain_text_is_none(text: str) -> None:
    assert parse_calls(plan("auto"), text) is None


@pytest.mark.parametrize("form", ["generic", "hermes"])
def test_auto_text_then_calls_is_content_and_calls(form: str) -> None:
    made = plan("auto")
    calls = TOOL_CALL_MARKER + PARIS if form == "generic" else hermes_text([("get_weather", {"city": "Paris"})], {})
    answer = read_answer(made, "Let me check. " + calls, FORMATS[form])
    assert answer.content == "Let me check. "
    assert calls_of(answer.calls) == [("get_weather", {"city": "Paris"})]
    for chunks in (["Let me check. " + calls], [*"Let me check. ", calls], ["Let me check. <tool", calls[5:]]):
        _, result = stream(made, chunks, form)
        assert result.content == "Let me check. "
        assert named_and_arguments(result.calls) == [("get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("text", ["<", "<tool", "<tool_call", TOOL_CALL_MARKER])
def test_auto_marker_cut_short_is_call_syntax_not_content(text: str) -> None:
    assert read_answer(plan("auto"), text, cut_short=True) == ReadAnswer("", [])


@pytest.mark.parametrize("text", ["<", "See <tool", "a <tool_call"])
def test_text_that_ends_like_the_trigger_is_content_when_the_model_ended_it(text: str) -> None:
    """The grammar lets text end so (it holds no whole trigger): a model that stopped there wrote text."""
    assert read_answer(plan("auto"), text) == ReadAnswer(text, None)
    tool_stream, result = stream(plan("auto"), [text[:3], text[3:]])
    assert (result.content, result.calls, tool_stream.calls) == (text, [], 0)


# JsonArraySplitter --------------------------------------------------------------------------

STRING = st.text(alphabet=st.sampled_from('ab []{}",:\\\n\t/é😀\u2028\x00'), max_size=8) | st.text(max_size=6)
SCALAR = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | STRING
VALUE = st.recursive(
    SCALAR,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(STRING, children, max_size=4),
    max_leaves=12,
)
OBJECTS = st.lists(st.dictionaries(STRING, VALUE, max_size=4), max_size=5)
DUMPS: list[dict[str, Any]] = [
    {},
    {"separators": (",", ":")},
    {"ensure_ascii": False},
    {"separators": (",", ":"), "ensure_ascii": False},
    {"indent": 2},
    {"indent": "\t", "ensure_ascii": False},
]


def chunked(text: str, data: st.DataObject) -> list[str]:
    """``text`` cut at arbitrary points (empty chunks included)."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12), label="cuts"))
    bounds = [0, *cuts, len(text)]
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


@settings(max_examples=150, deadline=None)
@given(OBJECTS, st.sampled_from(DUMPS), st.data())
def test_splitter_yields_each_element(
    objects: list[dict[str, Any]], dumps: dict[str, Any], data: st.DataObject
) -> None:
    text = json.dumps(objects, **dumps)
    splitter = JsonArraySplitter()
    elements = [element for chunk in chunked(text, data) for element in splitter.feed(chunk)]
    assert [json.loads(element) for element in elements] == objects


def test_splitter_one_character_at_a_time() -> None:
    objects = [{"a": "]}", "b": ['"[{'], "c": {"\\": '\\\\"'}}, {}, {"x": [[], {}]}]
    splitter = JsonArraySplitter()
    elements = [element for char in json.dumps(objects) for element in splitter.feed(char)]
    assert elements == [json.dumps(o) for o in objects]


def test_splitter_waits_for_the_element_to_close() -> None:
    splitter = JsonArraySplitter()
    assert list(splitter.feed('[{"a": [1, ')) == []
    assert list(splitter.feed("2]}")) == ['{"a": [1, 2]}']
    assert list(splitter.feed(', {"b"')) == []
    assert list(splitter.feed(": {}}]")) == ['{"b": {}}']


# ToolCallStream -----------------------------------------------------------------------------


@dataclass
class Reassembled:
    content: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)


def reassemble(deltas: list[ChatDelta]) -> Reassembled:
    """OpenAI's rule: arguments concatenate per index; id and name come from an index's first delta."""
    result = Reassembled()
    for delta in deltas:
        assert delta.role is None
        if delta.content is not None:
            assert delta.tool_calls is None
            result.content += delta.content
        for call in delta.tool_calls or []:
            if call.index == len(result.calls):
                assert call.id is not None
                assert call.id.startswith("call_")
                assert call.type == "function"
                assert call.function.name is not None
                result.calls.append(
                    {"id": call.id, "name": call.function.name, "arguments": call.function.arguments or ""}
                )
            else:
                assert call.index == len(result.calls) - 1, "indexes go up by one"
                assert call.id is None
                assert call.function.name is None
                result.calls[call.index]["arguments"] += call.function.arguments or ""
    return result


def stream(made: ToolPlan, chunks: list[str], form: str = "generic") -> tuple[ToolCallStream, Reassembled]:
    tool_stream = ToolCallStream(made, FORMATS[form])
    deltas = [delta for chunk in chunks for delta in tool_stream.feed(chunk)]
    deltas += tool_stream.finish()
    return tool_stream, reassemble(deltas)


def named_and_arguments(calls: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["name"], c["arguments"]) for c in calls]


ARGUMENTS = st.dictionaries(STRING, VALUE, max_size=3)
CALLS = st.lists(st.tuples(st.sampled_from(["get_weather", "get_time"]), ARGUMENTS), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(CALLS, st.sampled_from(["required", "auto"]), st.sampled_from(DUMPS), st.data())
def test_streamed_call_lists_reassemble_to_the_parsed_calls(
    calls: list[tuple[str, dict[str, Any]]], mode: str, dumps: dict[str, Any], data: st.DataObject
) -> None:
    made = plan(mode)
    text = json.dumps([{"name": name, "arguments": arguments} for name, arguments in calls], **dumps)
    if mode == "auto":
        text = TOOL_CALL_MARKER + text
    tool_stream, result = stream(made, chunked(text, data))
    parsed = parse_calls(made, text)
    assert parsed is not None
    assert result.content == ""
    assert named_and_arguments(result.calls) == [(c.name, c.arguments) for c in parsed]
    assert [json.loads(c["arguments"]) for c in result.calls] == [arguments for _, arguments in calls]
    assert len({c["id"] for c in result.calls}) == len(calls)
    assert tool_stream.calls == len(calls)


def hermes_text(calls: list[tuple[str, dict[str, Any]]], dumps: dict[str, Any]) -> str:
    """Calls as the hermes format writes them: each a JSON object between tags."""
    objects = [json.dumps({"name": name, "arguments": arguments}, **dumps) for name, arguments in calls]
    return "\n".join(f"<tool_call>\n{text}\n</tool_call>" for text in objects)


def llama_text(calls: list[tuple[str, dict[str, Any]]], dumps: dict[str, Any]) -> str:
    """Calls as llama3_json writes them: bare objects with "parameters", separated by "; "."""
    return "; ".join(json.dumps({"name": name, "parameters": arguments}, **dumps) for name, arguments in calls)


def mistral_text(calls: list[tuple[str, dict[str, Any]]], dumps: dict[str, Any]) -> str:
    """Calls as mistral writes them, forced or not: [TOOL_CALLS] and a JSON list."""
    return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments} for name, arguments in calls], **dumps)


WRITERS = {"hermes": hermes_text, "llama3_json": llama_text, "mistral": mistral_text}


@settings(max_examples=100, deadline=None)
@given(
    CALLS, st.sampled_from(["required", "auto"]), st.sampled_from(sorted(WRITERS)), st.sampled_from(DUMPS), st.data()
)
def test_streamed_calls_in_a_models_format_reassemble_to_the_parsed_calls(
    calls: list[tuple[str, dict[str, Any]]], mode: str, form: str, dumps: dict[str, Any], data: st.DataObject
) -> None:
    """However the text is cut into chunks (one chunk may carry whole calls, even two)."""
    made = plan(mode)
    text = WRITERS[form](calls, dumps)
    tool_stream, result = stream(made, chunked(text, data), form)
    parsed = parse_calls(made, text, FORMATS[form])
    assert parsed is not None
    assert result.content == ""
    assert named_and_arguments(result.calls) == [(c.name, c.arguments) for c in parsed]
    assert [json.loads(c["arguments"]) for c in result.calls] == [arguments for _, arguments in calls]
    assert tool_stream.calls == len(calls)


def test_mistral_text_then_calls_and_a_trigger_cut_short() -> None:
    made, form = plan("auto"), FORMATS["mistral"]
    text = "Checking. " + mistral_text([("get_weather", {"city": "Paris"})], {})
    answer = read_answer(made, text, form)
    assert (answer.content, calls_of(answer.calls)) == ("Checking. ", [("get_weather", {"city": "Paris"})])
    _, result = stream(made, ["Checking. [TOOL", text[len("Checking. [TOOL") :]], "mistral")
    assert (result.content, named_and_arguments(result.calls)) == ("Checking. ", [("get_weather", '{"city": "Paris"}')])
    for mode in ("auto", "required"):
        assert read_answer(plan(mode), "[TOOL_CA", form, cut_short=True) == ReadAnswer("", [])


def test_two_hermes_calls_in_one_chunk_are_both_complete_and_in_order() -> None:
    text = hermes_text([("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})], {})
    _, result = stream(plan("auto"), [text], "hermes")
    assert named_and_arguments(result.calls) == [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "UTC"}')]


def test_hermes_auto_plain_text_is_content_and_a_call_cut_short_keeps_its_arguments() -> None:
    made = plan("auto")
    assert parse_calls(made, "It is sunny.", FORMATS["hermes"]) is None
    _, result = stream(made, ["It is ", "sunny."], "hermes")
    assert (result.content, result.calls) == ("It is sunny.", [])
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    parsed = parse_calls(made, cut, FORMATS["hermes"])
    assert parsed is not None and [(c.name, c.arguments) for c in parsed] == [("get_weather", '{"city": "Par')]


@settings(max_examples=60, deadline=None)
@given(ARGUMENTS, st.sampled_from(DUMPS), st.data())
def test_streamed_named_call_reassembles_to_the_parsed_call(
    arguments: dict[str, Any], dumps: dict[str, Any], data: st.DataObject
) -> None:
    made = plan(NAMED_WEATHER)
    text = json.dumps(arguments, **dumps)
    tool_stream, result = stream(made, chunked(text, data))
    parsed = parse_calls(made, text)
    assert parsed is not None
    assert result.content == ""
    assert named_and_arguments(result.calls) == [(c.name, c.arguments) for c in parsed]
    assert tool_stream.calls == 1


def test_streamed_named_call_cut_short_is_the_text_so_far() -> None:
    _, result = stream(plan(NAMED_WEATHER), ['{"ci', "", 'ty": "Pa'])
    assert named_and_arguments(result.calls) == [("get_weather", '{"city": "Pa')]


def test_named_stream_without_text_has_no_call() -> None:
    tool_stream, result = stream(plan(NAMED_WEATHER), ["", ""])
    assert result == Reassembled()
    assert tool_stream.calls == 0


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30) | st.sampled_from(["<b>", "<toolbox>", "<tool_calls", "a<tool_cal"]), st.data())
def test_auto_plain_text_streams_as_content(text: str, data: st.DataObject) -> None:
    made = plan("auto")
    text = text.replace(TOOL_CALL_MARKER, "") + "."  # plain text, which cannot end in the trigger's beginning
    tool_stream, result = stream(made, chunked(text, data))
    assert result.content == text
    assert result.calls == []
    assert tool_stream.calls == 0
    assert parse_calls(made, text) is None


@pytest.mark.parametrize("chunks", [["<"], ["<to", "ol"], ["<tool_call"], ["", "<tool_cal", ""], ["<tool_call>"]])
def test_auto_marker_cut_short_streams_nothing(chunks: list[str]) -> None:
    tool_stream = ToolCallStream(plan("auto"))
    assert [delta for chunk in chunks for delta in tool_stream.feed(chunk)] == []
    assert tool_stream.finish(cut_short=True) == []
    assert tool_stream.calls == 0


def test_auto_text_that_turns_out_not_to_be_the_marker() -> None:
    tool_stream = ToolCallStream(plan("auto"))
    assert tool_stream.feed("<tool") == []
    assert tool_stream.feed("box> is") == [ChatDelta(content="<toolbox> is")]
    assert tool_stream.feed(" here") == [ChatDelta(content=" here")]
    assert tool_stream.finish() == []


def test_auto_marker_split_across_chunks_then_calls() -> None:
    tool_stream = ToolCallStream(plan("auto"))
    assert tool_stream.feed("<tool_") == []
    assert tool_stream.feed("call>[") == []
    deltas = tool_stream.feed(PARIS[1:])
    result = reassemble(deltas)
    assert named_and_arguments(result.calls) == [("get_weather", '{"city": "Paris"}')]
    assert tool_stream.finish() == []


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_the_name_streams_as_soon_as_it_is_complete(mode: str) -> None:
    tool_stream = ToolCallStream(plan(mode))
    prefix = TOOL_CALL_MARKER if mode == "auto" else ""
    assert tool_stream.feed(prefix + '[{"name": "get_wea') == []
    (started,) = tool_stream.feed('ther", "argu')
    assert started.tool_calls is not None
    assert started.tool_calls[0].function.name == "get_weather"
    assert started.tool_calls[0].function.arguments == ""
    pieces = [tool_stream.feed(text) for text in ['ments": {"ci', 'ty": "Paris"', "}} ", "]"]]
    arguments = [delta.tool_calls[0].function.arguments for deltas in pieces for delta in deltas if delta.tool_calls]
    assert arguments == ['{"ci', 'ty": "Paris"', "}"]
    assert tool_stream.finish() == []


# Under auto with a JSON answer format, calls begin only where the output begins (the grammar is
# `calls | answer`): the reader agrees, so a trigger inside the answer is the answer's text.


def json_answer_plan() -> ToolPlan:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "auto"}
    )
    made = plan_tools(request.tools, request.tool_choice, None, json.dumps({"type": "object"}))
    assert made is not None and made.calls_at_start_only
    return made


def generic_text(calls: list[tuple[str, dict[str, Any]]], dumps: dict[str, Any]) -> str:
    return TOOL_CALL_MARKER + json.dumps([{"name": name, "arguments": arguments} for name, arguments in calls], **dumps)


ANSWER_WRITERS = {**WRITERS, "generic": generic_text}
TRIGGERS = ["<tool_call>", "[TOOL_CALLS]", "{", '{"name": "get_weather", "parameters": {}}', "</tool_call>"]


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(STRING, st.sampled_from(TRIGGERS) | STRING, min_size=1, max_size=3),
    st.sampled_from(sorted(ANSWER_WRITERS)),
    st.sampled_from(DUMPS),
    st.data(),
)
def test_a_json_answer_holding_a_trigger_is_the_answer_whole_and_streamed(
    answer: dict[str, Any], form: str, dumps: dict[str, Any], data: st.DataObject
) -> None:
    made = json_answer_plan()
    text = json.dumps(answer, **dumps)
    assert read_answer(made, text, FORMATS[form]) == ReadAnswer(text, None)
    _, result = stream(made, chunked(text, data), form)
    assert (result.content, result.calls) == (text, [])


@settings(max_examples=60, deadline=None)
@given(CALLS, st.sampled_from(sorted(ANSWER_WRITERS)), st.sampled_from(DUMPS), st.data())
def test_calls_that_open_the_output_are_calls_beside_a_json_answer_format(
    calls: list[tuple[str, dict[str, Any]]], form: str, dumps: dict[str, Any], data: st.DataObject
) -> None:
    made = json_answer_plan()
    text = ANSWER_WRITERS[form](calls, dumps)
    answer = read_answer(made, text, FORMATS[form])
    assert answer.content == "" and calls_of(answer.calls) == [(name, arguments) for name, arguments in calls]
    _, result = stream(made, chunked(text, data), form)
    assert result.content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in result.calls] == calls


def test_a_llama_answer_opening_with_a_brace_is_content_and_a_head_cut_short_is_a_call() -> None:
    made, form = json_answer_plan(), FORMATS["llama3_json"]
    assert read_answer(made, '{"city": "Paris"}', form) == ReadAnswer('{"city": "Paris"}', None)
    _, result = stream(made, ['{"ci', 'ty": "Paris"}'], "llama3_json")
    assert (result.content, result.calls) == ('{"city": "Paris"}', [])
    cut = '{"name": "get_wea'
    cut_calls = read_answer(made, cut, form, cut_short=True).calls
    assert cut_calls is not None and [(c.name, c.arguments) for c in cut_calls] == [("get_weather", "")]
    tool_stream = ToolCallStream(made, form)
    assert tool_stream.feed(cut) == []
    assert [d.tool_calls[0].function.name for d in tool_stream.finish(cut_short=True) if d.tool_calls] == [
        "get_weather"
    ]
