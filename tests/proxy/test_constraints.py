"""Constraints and tools through the app, in-process: OpenAI fields -> guide type and guide, outputs -> tool_calls.

A scripted client stands in for Triton (tests/proxy/scripted.py), so these tests show what
the proxy sends and how it frames what comes back.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk as SdkChatCompletionChunk
from openai.types.chat import ChatCompletionMessageToolCall
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from llgtriton import wire
from llgtriton.guides import grammar_for
from llgtriton.messages import ChatMessage
from llgtriton.tool_formats import FORMATS
from llgtriton.tools import PastCall, ToolMode
from llgtriton.wire import GuideType
from proxy.errors import InvalidRequestError
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.translate import translates_quickly
from tests.llgtriton.matching import accepts
from tests.proxy.scripted import (
    MODEL,
    USER,
    ScriptedClient,
    assert_error,
    chat_body,
    completion_body,
    sse_events,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PATHS = [CHAT, COMPLETIONS]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
}
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_PARAMETERS},
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}
TOOLS = [WEATHER, TIME]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
PARIS_ARGUMENTS = '{"city": "Paris"}'
TWO_CALLS = (
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]'
)


def _body(path: str, **fields: Any) -> dict[str, Any]:
    return chat_body(**fields) if path == CHAT else completion_body(**fields)


def _outputs(*texts: str, reason: wire.FinishReason = wire.FinishReason.STOP) -> list[wire.GenerationOutput]:
    """A scripted generation: one output per text, the last one finishing with ``reason``."""
    outputs = [wire.GenerationOutput(text) for text in texts[:-1]]
    outputs.append(wire.GenerationOutput(texts[-1], reason, prompt_tokens=5, completion_tokens=len(texts)))
    return outputs


def generic_grammar(request: wire.GenerationRequest) -> str:
    """The compiled grammar of the tools sent, as a backend writing our own format builds it."""
    assert request.tools is not None
    answer = request.guide if request.guide_type is GuideType.JSON_SCHEMA else None
    return grammar_for(GuideType.LARK, FORMATS["generic"].grammar(request.tools, answer))


async def _constraint(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, **fields: Any
) -> wire.GenerationRequest:
    response = await http.post(path, json=_body(path, **fields))
    assert response.status_code == 200, response.text
    assert len(client.requests) == 1
    return client.requests[0]


# Constraint fields -> guide type and guide --------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
async def test_json_object_is_json_without_a_guide(http: httpx.AsyncClient, client: ScriptedClient, path: str) -> None:
    request = await _constraint(http, client, path, response_format={"type": "json_object"})
    assert (request.guide_type, request.guide) == (GuideType.JSON, None)


PRETTY = json.dumps({"name": "Ann", "age": 3}, indent=2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "layout",
    [
        ({}, True, True),  # the server's bounded whitespace: either layout
        ({"structured_outputs": {"disable_any_whitespace": True}}, True, False),
        ({"structured_outputs": {"whitespace_pattern": "[ ]?"}}, True, False),
        ({"guided_whitespace_pattern": "[ \\n]{0,3}"}, True, True),
    ],
)
@pytest.mark.parametrize(
    "constraint",
    [
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
        {"guided_json": SCHEMA},
    ],
)
async def test_a_request_can_choose_its_json_layout(
    http: httpx.AsyncClient,
    client: ScriptedClient,
    path: str,
    layout: tuple[dict[str, Any], bool, bool],
    constraint: dict[str, Any],
) -> None:
    fields, compact, pretty = layout
    request = await _constraint(http, client, path, **constraint, **fields)
    grammar = grammar_for(request.guide_type or GuideType.JSON, request.guide)
    assert accepts(grammar, json.dumps({"name": "Ann", "age": 3})) is compact
    assert accepts(grammar, PRETTY) is pretty
    has_schema = constraint.get("response_format", {}).get("type") != "json_object"
    assert accepts(grammar, '{"name": 1}') is not has_schema  # the schema still holds


async def test_a_json_layout_leaves_other_constraints_alone(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    fields = {"structured_outputs": {"regex": "[0-9]+", "disable_any_whitespace": True}}
    request = await _constraint(http, client, CHAT, **fields)
    assert (request.guide_type, request.guide) == (GuideType.REGEX, "[0-9]+")


@pytest.mark.parametrize("path", PATHS)
async def test_text_response_format_is_no_constraint(
    http: httpx.AsyncClient, client: ScriptedClient, path: str
) -> None:
    request = await _constraint(http, client, path, response_format={"type": "text"})
    assert (request.guide_type, request.guide) == (None, None)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("strict", [True, False, None])
async def test_json_schema_is_enforced_strict_or_not(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, strict: bool | None
) -> None:
    spec: dict[str, Any] = {"name": "person", "schema": SCHEMA}
    if strict is not None:
        spec["strict"] = strict
    request = await _constraint(http, client, path, response_format={"type": "json_schema", "json_schema": spec})
    assert request.guide_type is GuideType.JSON_SCHEMA
    assert request.guide is not None
    # Strict, as at OpenAI, the object is closed; otherwise the schema is passed on as it is.
    assert json.loads(request.guide) == ({**SCHEMA, "additionalProperties": False} if strict else SCHEMA)
    closed = accepts(grammar_for(GuideType.JSON_SCHEMA, request.guide), '{"name": "Ann", "extra": 1}')
    assert closed is not bool(strict)


async def test_json_schema_true(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "any", "schema": True}}}
    request = await _constraint(http, client, CHAT, **fields)
    assert (request.guide_type, request.guide) == (GuideType.JSON_SCHEMA, "true")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "person"}},
        {"type": "json_schema", "json_schema": {"name": "person", "schema": None, "strict": True}},
    ],
)
async def test_json_schema_without_a_schema_is_a_400(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, response_format: dict[str, Any]
) -> None:
    response = await http.post(path, json=_body(path, response_format=response_format))
    assert_error(response, 400, "invalid_request_error", param="response_format")
    assert client.requests == []


STRUCTURED: list[tuple[dict[str, Any], GuideType, str]] = [
    ({"json": SCHEMA}, GuideType.JSON_SCHEMA, json.dumps(SCHEMA)),
    ({"json": json.dumps(SCHEMA)}, GuideType.JSON_SCHEMA, json.dumps(SCHEMA)),
    ({"regex": r"\d{3}"}, GuideType.REGEX, r"\d{3}"),
    ({"choice": ["yes", "no"]}, GuideType.CHOICE, '["yes", "no"]'),
    ({"grammar": 'start: "a" | "b"'}, GuideType.LARK, 'start: "a" | "b"'),
]


@pytest.mark.parametrize("form", ["structured_outputs", "guided_fields"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("outputs", "guide_type", "guide"), STRUCTURED)
async def test_structured_outputs_and_guided_fields(
    *,
    http: httpx.AsyncClient,
    client: ScriptedClient,
    form: str,
    path: str,
    outputs: dict[str, Any],
    guide_type: GuideType,
    guide: str,
) -> None:
    """vLLM's ``structured_outputs`` object and its older ``guided_*`` fields mean the same."""
    if form == "structured_outputs":
        fields: dict[str, Any] = {"structured_outputs": outputs}
    else:
        ((key, value),) = outputs.items()
        fields = {f"guided_{key}": value}
    request = await _constraint(http, client, path, **fields)
    assert (request.guide_type, request.guide) == (guide_type, guide)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "guided_regex": "a+"},
        {"structured_outputs": {"regex": "a+"}, "guided_choice": ["a"]},
        {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
        {"guided_regex": "a+", "guided_json": SCHEMA},
        {"structured_outputs": {}},
    ],
)
async def test_two_constraints_at_once_is_a_400(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, fields: dict[str, Any]
) -> None:
    error = assert_error(await http.post(path, json=_body(path, **fields)), 400, "invalid_request_error")
    assert error["param"]
    assert client.requests == []


@pytest.mark.parametrize("tool_choice", ["required", "auto", NAMED])
async def test_tools_and_a_non_json_constraint_at_once_is_a_400(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: Any
) -> None:
    body = chat_body(tools=TOOLS, tool_choice=tool_choice, guided_regex="[a-z]+")
    error = assert_error(await http.post(CHAT, json=body), 400, "invalid_request_error", param="tools")
    assert "one constraint per request" in error["message"]
    assert client.requests == []


TOOL_CALL_MARKER = "<tool_call>"  # our own format's trigger
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}, {"type": "json_object"}],
    ids=["json_schema", "json_object"],
)
async def test_tools_with_a_response_format_answer_in_the_format_or_call(
    http: httpx.AsyncClient, client: ScriptedClient, response_format: dict[str, Any]
) -> None:
    """openai-agents' Agent(output_type=X, tools=[...]) and the SDK's parse(response_format=..., tools=...).

    The answer format travels as the constraint, beside the tools; the backend's grammar holds both."""
    request = await _constraint(http, client, CHAT, tools=TOOLS, tool_choice="auto", response_format=response_format)
    assert request.tools is not None and request.tools.mode is ToolMode.AUTO
    assert request.guide_type in (GuideType.JSON, GuideType.JSON_SCHEMA)
    answer = request.guide or json.dumps({"type": "object"})
    grammar = grammar_for(GuideType.LARK, FORMATS["generic"].grammar(request.tools, answer))
    assert accepts(grammar, '{"answer": 42}')
    assert accepts(grammar, TOOL_CALL_MARKER + '[{"name": "get_time", "arguments": {"tz": "UTC"}}]')
    assert not accepts(grammar, "The answer is 42.")


async def test_tools_required_with_a_response_format_call(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    request = await _constraint(
        http, client, CHAT, tools=TOOLS, tool_choice="required", response_format=response_format
    )
    assert request.guide_type is None and request.tools is not None
    grammar = grammar_for(GuideType.LARK, FORMATS["generic"].grammar(request.tools))
    assert accepts(grammar, TWO_CALLS)
    assert not accepts(grammar, '{"answer": 42}')


async def test_tool_choice_none_leaves_room_for_a_constraint(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    request = await _constraint(
        http, client, CHAT, tools=TOOLS, tool_choice="none", response_format={"type": "json_object"}
    )
    assert (request.guide_type, request.guide) == (GuideType.JSON, None)
    assert request.messages == (ChatMessage("user", "Say hello"),)


INVALID: list[tuple[dict[str, Any], str, str]] = [
    ({"structured_outputs": {"regex": "(abc"}}, "structured_outputs.regex", "unclosed group"),
    ({"guided_regex": "a{2,1}"}, "", "invalid repetition count range"),
    ({"structured_outputs": {"grammar": "start: greeting"}}, "structured_outputs.grammar", 'unknown name: "greeting"'),
    ({"guided_grammar": 'start: "a'}, "", "lexer error"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}},
        "response_format",
        "Invalid type: foo",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {"pattern": "^a"}}}}},
        "response_format",
        "Unimplemented keys",
    ),
    ({"structured_outputs": {"json": '{"type": "object"'}}, "structured_outputs.json", "not valid JSON"),
    ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}}, "", "/missing"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty list of strings"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("fields", "param", "problem"), INVALID)
async def test_invalid_constraint_is_a_400_with_llguidance_message(
    *,
    http: httpx.AsyncClient,
    client: ScriptedClient,
    path: str,
    stream: bool,
    fields: dict[str, Any],
    param: str,
    problem: str,
) -> None:
    response = await http.post(path, json=_body(path, stream=stream, **fields))
    error = assert_error(response, 400, "invalid_request_error", code="invalid_constraint")
    assert problem in error["message"]
    assert error["param"]
    assert error["message"].startswith(f"invalid {error['param']}: ")
    if param:
        assert error["param"] == param
    assert client.requests == []


async def test_invalid_constraint_through_the_sdk(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body={"guided_regex": "(abc"}
        )
    assert caught.value.code == "invalid_constraint"
    assert "unclosed group" in caught.value.message
    assert client.requests == []


# What the Triton client raises when the backend refuses a request's grammar (tests/proxy/test_triton_client.py).
BACKEND_REFUSAL = InvalidRequestError("at 1(7): unknown name", code="invalid_constraint")
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        (CHAT, {"tools": TOOLS}, "tools"),
        (CHAT, {"tools": TOOLS, "response_format": JSON_SCHEMA_FORMAT}, "tools"),  # the format holds alone
        (CHAT, {"response_format": JSON_SCHEMA_FORMAT}, "response_format"),
        (COMPLETIONS, {"structured_outputs": {"regex": "[0-9]+"}}, "structured_outputs.regex"),
    ],
)
async def test_a_grammar_the_backend_refuses_is_a_400_naming_the_field_it_came_from(
    *, http: httpx.AsyncClient, client: ScriptedClient, path: str, fields: dict[str, Any], param: str, stream: bool
) -> None:
    client.script(_outputs("x"), error=BACKEND_REFUSAL, error_after=0)
    response = await http.post(path, json=_body(path, stream=stream, **fields))
    error = assert_error(response, 400, "invalid_request_error", code="invalid_constraint", param=param)
    assert error["message"] == f"invalid {param}: at 1(7): unknown name"


# Tools: what the backend is asked for -------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_choice", "mode"),
    [(NAMED, ToolMode.NAMED), ("required", ToolMode.REQUIRED), ("auto", ToolMode.AUTO), (None, ToolMode.AUTO)],
)
async def test_the_tools_travel_to_the_backend_beside_the_callers_messages(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: Any, mode: ToolMode
) -> None:
    """The backend renders them into the model's template (or describes them, for a template
    without a tools section) and constrains the calls in the model's own format."""
    fields: dict[str, Any] = {"tools": TOOLS}
    if tool_choice is not None:
        fields["tool_choice"] = tool_choice
    request = await _constraint(http, client, CHAT, **fields)
    assert request.messages == (ChatMessage("user", "Say hello"),)
    assert (request.guide_type, request.guide) == (None, None)
    assert request.tools is not None
    assert request.tools.mode is mode
    names = [f.name for f in request.tools.functions]
    assert names == (["get_weather"] if tool_choice == NAMED else ["get_weather", "get_time"])
    assert request.tools.functions[0].description == "The weather in a city"
    assert request.tools.functions[0].parameters == {**WEATHER_PARAMETERS, "additionalProperties": False}


async def test_tool_calls_and_tool_results_in_the_request(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and the time in UTC?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": PARIS_ARGUMENTS}},
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21°C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [{"function": {"name": "get_weather"}}]},
    ]
    request = await _constraint(http, client, CHAT, messages=messages, tools=TOOLS)
    assert request.messages == (
        ChatMessage("user", "Weather in Paris and the time in UTC?"),
        ChatMessage(
            "assistant",
            "",
            tool_calls=(
                PastCall("get_weather", json.dumps(json.loads(PARIS_ARGUMENTS)), "call_1"),
                PastCall("get_time", '{"tz": "UTC"}', "call_2"),
            ),
        ),
        ChatMessage("tool", "sunny, 21°C", tool_call_id="call_1"),
        ChatMessage("tool", "12:00", tool_call_id="call_2"),
        ChatMessage("assistant", "Let me check.", tool_calls=(PastCall("get_weather", "{}"),)),
    )


async def test_a_tool_result_for_a_call_never_made_is_a_400(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    messages = [
        *USER,
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        {"role": "tool", "tool_call_id": "call_9", "content": "done too"},
    ]
    error = assert_error(
        await http.post(CHAT, json=chat_body(messages=messages, tools=TOOLS)), 400, "invalid_request_error"
    )
    assert error["param"] == "messages.3.tool_call_id" and "call_9" in error["message"]
    assert client.requests == []


@pytest.mark.parametrize("arguments", ["[" * 100_000, "1" * 5_000, '"\\ud800"'], ids=["deep", "long-int", "surrogate"])
async def test_earlier_call_arguments_json_cannot_read_travel_as_text(
    http: httpx.AsyncClient, client: ScriptedClient, arguments: str
) -> None:
    """Arguments nested past the recursion limit, or an integer longer than Python reads, are the
    client's text: the model sees what was sent, and the proxy answers (no 500)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    request = await _constraint(http, client, CHAT, messages=[*USER, {"role": "assistant", "tool_calls": [call]}])
    assert request.messages is not None
    (past,) = request.messages[1].tool_calls
    assert past.name == "f" and past.id == "c1"


async def test_tool_messages_without_tools(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    messages = [
        *USER,
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "done"},
    ]
    request = await _constraint(http, client, CHAT, messages=messages)
    assert request.messages == (
        ChatMessage("user", "Say hello"),
        ChatMessage("assistant", "", tool_calls=(PastCall("f", '"not json"'),)),
        ChatMessage("tool", "done", tool_call_id="x"),
    )
    assert request.guide_type is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ],
)
async def test_bad_tools_are_a_400(
    http: httpx.AsyncClient, client: ScriptedClient, fields: dict[str, Any], param: str
) -> None:
    assert_error(await http.post(CHAT, json=chat_body(**fields)), 400, "invalid_request_error", param=param)
    assert client.requests == []


@pytest.mark.parametrize("tool_choice", [NAMED, "required", "auto"])
async def test_a_tool_schema_is_judged_by_the_backend_that_builds_its_grammar(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: Any
) -> None:
    """The proxy compiles no grammar of its own for tools: the backend builds the model's (its
    refusal is a 400 naming ``tools``: test_a_grammar_the_backend_refuses_is_a_400_naming_the_field_it_came_from)."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "foo"}}}
    client.script(_outputs("{}"))
    await _constraint(http, client, CHAT, tools=[tool], tool_choice=tool_choice)
    sent = client.requests[0].tools
    assert sent is not None and sent.functions[0].parameters["type"] == "foo"


# Tools: the response ------------------------------------------------------------------------


def _tool_calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    calls: list[dict[str, Any]] = message["tool_calls"]
    for call in calls:
        assert set(call) == {"id", "type", "function"}
        assert call["id"].startswith("call_")
        assert call["type"] == "function"
        assert set(call["function"]) == {"name", "arguments"}
    assert len({call["id"] for call in calls}) == len(calls)
    return calls


def _names_and_arguments(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(call["function"]["name"], call["function"]["arguments"]) for call in calls]


async def test_named_tool_call_response(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(_outputs('{"city": ', '"Paris"}'))
    body = (await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice=NAMED))).json()
    assert body["choices"][0]["message"]["content"] is None
    assert _names_and_arguments(_tool_calls(body)) == [("get_weather", PARIS_ARGUMENTS)]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


@pytest.mark.parametrize(("tool_choice", "prefix"), [("required", ""), ("auto", TOOL_CALL_MARKER)])
async def test_call_list_response(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: str, prefix: str
) -> None:
    text = prefix + TWO_CALLS
    client.script(_outputs(text[:10], text[10:50], text[50:]))
    body = (await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice=tool_choice))).json()
    assert body["choices"][0]["message"]["content"] is None
    assert _names_and_arguments(_tool_calls(body)) == [
        ("get_weather", PARIS_ARGUMENTS),
        ("get_time", '{"tz": "UTC"}'),
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


async def test_named_call_cut_short_keeps_length(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(_outputs('{"city": ', '"Pa', reason=wire.FinishReason.LENGTH))
    body = (await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice=NAMED, max_tokens=2))).json()
    assert _names_and_arguments(_tool_calls(body)) == [("get_weather", '{"city": "Pa')]
    assert body["choices"][0]["finish_reason"] == "length"


async def test_call_list_cut_short_keeps_length_its_calls_and_the_partial_one(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    text = TWO_CALLS[:-11]  # inside the second call's arguments
    expected = [("get_weather", PARIS_ARGUMENTS), ("get_time", '{"tz')]
    client.script(_outputs(text, reason=wire.FinishReason.LENGTH))
    body = (await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice="required"))).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] is None
    assert _names_and_arguments(_tool_calls(body)) == expected
    client.script(_outputs(text[:30], text[30:], reason=wire.FinishReason.LENGTH))
    streamed = await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice="required", stream=True))
    content, calls, reasons = _reassemble(sse_events(streamed))
    assert content == ""
    assert _names_and_arguments(calls) == expected
    assert reasons[-1] == "length"


@pytest.mark.parametrize("cut", [3, len(TOOL_CALL_MARKER), len(TOOL_CALL_MARKER) + 12])
async def test_auto_cut_short_before_any_call_is_neither_content_nor_a_call(
    http: httpx.AsyncClient, client: ScriptedClient, cut: int
) -> None:
    text = (TOOL_CALL_MARKER + TWO_CALLS)[:cut]
    client.script(_outputs(text, reason=wire.FinishReason.LENGTH))
    body = (await http.post(CHAT, json=chat_body(tools=TOOLS))).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": None}
    assert body["choices"][0]["finish_reason"] == "length"
    client.script(_outputs(text[:5], text[5:], reason=wire.FinishReason.LENGTH))
    content, calls, reasons = _reassemble(sse_events(await http.post(CHAT, json=chat_body(tools=TOOLS, stream=True))))
    assert (content, calls, reasons[-1]) == ("", [], "length")


async def test_auto_text_before_calls_is_the_content_beside_them(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    client.script(_outputs("Let me ", "check." + TOOL_CALL_MARKER + TWO_CALLS[:20], TWO_CALLS[20:]))
    choice = (await http.post(CHAT, json=chat_body(tools=TOOLS))).json()["choices"][0]
    assert choice["message"]["content"] == "Let me check."
    assert _names_and_arguments(choice["message"]["tool_calls"]) == [
        ("get_weather", PARIS_ARGUMENTS),
        ("get_time", '{"tz": "UTC"}'),
    ]
    assert choice["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("text", ["It is sunny in Paris.", "<b>bold</b>", "a <tool_calls> b"])
async def test_auto_with_plain_text_is_content(http: httpx.AsyncClient, client: ScriptedClient, text: str) -> None:
    client.script(_outputs(text[:3], text[3:]))
    body = (await http.post(CHAT, json=chat_body(tools=TOOLS))).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert body["choices"][0]["finish_reason"] == "stop"


# Tools: streaming ---------------------------------------------------------------------------


def _reassemble(events: list[Any]) -> tuple[str, list[dict[str, Any]], list[str | None]]:
    """Content, tool calls (OpenAI's rule: arguments concatenate per index, id/name from the first delta) and
    finish reasons of a chat stream."""
    content = ""
    calls: list[dict[str, Any]] = []
    reasons: list[str | None] = []
    for event in events:
        assert event["object"] == "chat.completion.chunk"
        choice = event["choices"][0]
        reasons.append(choice["finish_reason"])
        delta = choice["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            if call["index"] == len(calls):
                calls.append(
                    {
                        "id": call["id"],
                        "type": call["type"],
                        "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                    }
                )
            else:
                assert call["index"] == len(calls) - 1
                assert set(call) == {"index", "function"}
                assert set(call["function"]) == {"arguments"}
                calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    return content, calls, reasons


TOOL_STREAMS: list[tuple[Any, str]] = [
    (NAMED, '{"city": "Paris"}'),
    ("required", TWO_CALLS),
    ("required", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("auto", TOOL_CALL_MARKER + TWO_CALLS),
]


@pytest.mark.parametrize(("tool_choice", "text"), TOOL_STREAMS)
@pytest.mark.parametrize("size", [1, 4, 1000])
async def test_streamed_tool_calls_reassemble_to_the_whole_response(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: Any, text: str, size: int
) -> None:
    client.script(_outputs(*[text[start : start + size] for start in range(0, len(text), size)]))
    body = chat_body(tools=TOOLS, tool_choice=tool_choice)
    whole = (await http.post(CHAT, json=body)).json()
    events = sse_events(await http.post(CHAT, json={**body, "stream": True}))
    content, calls, reasons = _reassemble(events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert content == ""
    assert reasons == [None] * (len(events) - 1) + ["tool_calls"]
    assert _names_and_arguments(calls) == _names_and_arguments(_tool_calls(whole))
    assert all(call["id"].startswith("call_") and call["type"] == "function" for call in calls)
    assert len({call["id"] for call in calls}) == len(calls)


HERMES_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
)


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
@pytest.mark.parametrize("size", [1, 7, 1000])
async def test_calls_in_the_format_the_backend_names_are_read_whole_and_streamed(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: str, size: int
) -> None:
    """A backend serving a Hermes-format model names the format in its first response."""
    outputs = _outputs(*[HERMES_CALLS[start : start + size] for start in range(0, len(HERMES_CALLS), size)])
    outputs[0] = dataclasses.replace(outputs[0], tool_call_format="hermes")
    client.script(outputs)
    body = chat_body(tools=TOOLS, tool_choice=tool_choice)
    whole = (await http.post(CHAT, json=body)).json()
    client.script(outputs)
    events = sse_events(await http.post(CHAT, json={**body, "stream": True}))
    content, calls, reasons = _reassemble(events)
    expected = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "UTC"}')]
    assert _names_and_arguments(_tool_calls(whole)) == expected
    assert whole["choices"][0]["message"]["content"] is None
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert (content, _names_and_arguments(calls), reasons[-1]) == ("", expected, "tool_calls")


async def test_a_format_the_proxy_does_not_know_is_a_server_error_not_content(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    outputs = _outputs(HERMES_CALLS)
    client.script([dataclasses.replace(outputs[0], tool_call_format="pythonic")])
    response = await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice="required"))
    assert response.status_code == 500
    assert "pythonic" in response.json()["error"]["message"]


async def test_streamed_named_call_cut_short_keeps_length(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(_outputs('{"ci', 'ty": "Pa', reason=wire.FinishReason.LENGTH))
    events = sse_events(await http.post(CHAT, json=chat_body(tools=TOOLS, tool_choice=NAMED, stream=True)))
    _, calls, reasons = _reassemble(events)
    assert _names_and_arguments(calls) == [("get_weather", '{"city": "Pa')]
    assert reasons[-1] == "length"


@pytest.mark.parametrize("text", ["It is sunny.", "<toolbox> time", "<b>hi</b>"])
async def test_streamed_auto_plain_text(http: httpx.AsyncClient, client: ScriptedClient, text: str) -> None:
    client.script(_outputs(*text))
    events = sse_events(await http.post(CHAT, json=chat_body(tools=TOOLS, stream=True)))
    content, calls, reasons = _reassemble(events)
    assert content == text
    assert calls == []
    assert reasons[-1] == "stop"
    assert all("tool_calls" not in event["choices"][0]["delta"] for event in events)


async def test_streamed_tool_calls_with_usage(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(_outputs(TWO_CALLS[:30], TWO_CALLS[30:]))
    body = chat_body(tools=TOOLS, tool_choice="required", stream=True, stream_options={"include_usage": True})
    events = sse_events(await http.post(CHAT, json=body))
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    _, calls, reasons = _reassemble(events[:-1])
    assert [call["function"]["name"] for call in calls] == ["get_weather", "get_time"]
    assert reasons[-1] == "tool_calls"


# Tools: through the openai SDK --------------------------------------------------------------

SDK_TOOLS: list[Any] = TOOLS


async def test_sdk_parses_a_tool_call_response(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(_outputs(TWO_CALLS))
    completion = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], tools=SDK_TOOLS, tool_choice="required"
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None
    assert all(isinstance(call, ChatCompletionMessageToolCall) for call in calls)
    parsed = [call for call in calls if isinstance(call, ChatCompletionMessageToolCall)]
    assert [(call.type, call.function.name, call.function.arguments) for call in parsed] == [
        ("function", "get_weather", PARIS_ARGUMENTS),
        ("function", "get_time", '{"tz": "UTC"}'),
    ]
    assert all(call.id.startswith("call_") for call in parsed)


async def test_sdk_parses_a_named_tool_call(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(_outputs(PARIS_ARGUMENTS))
    completion = await sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        tools=SDK_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    calls = completion.choices[0].message.tool_calls
    assert calls is not None
    (call,) = calls
    assert isinstance(call, ChatCompletionMessageToolCall)
    assert (call.function.name, call.function.arguments) == ("get_weather", PARIS_ARGUMENTS)
    assert completion.choices[0].finish_reason == "tool_calls"


async def test_sdk_parses_a_streamed_tool_call_response(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    text = TOOL_CALL_MARKER + TWO_CALLS
    client.script(_outputs(*[text[start : start + 7] for start in range(0, len(text), 7)]))
    stream = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], tools=SDK_TOOLS, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(chunk, SdkChatCompletionChunk) for chunk in chunks)
    deltas = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    assert all(isinstance(delta, ChoiceDeltaToolCall) for delta in deltas)
    arguments: dict[int, str] = {}
    names: dict[int, str | None] = {}
    for delta in deltas:
        assert delta.function is not None
        names.setdefault(delta.index, delta.function.name)
        arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
    assert names == {0: "get_weather", 1: "get_time"}
    assert arguments == {0: PARIS_ARGUMENTS, 1: '{"tz": "UTC"}'}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_sdk_stream_helper_accumulates_the_tool_calls(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(_outputs('{"ci', 'ty": ', '"Paris"}'))
    async with sdk.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        tools=SDK_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ) as stream:
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", PARIS_ARGUMENTS)
    assert call.id.startswith("call_")


async def test_sdk_sends_tool_messages(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    await sdk.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": PARIS_ARGUMENTS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        tools=SDK_TOOLS,
        tool_choice="none",
    )
    assert client.requests[0].messages == (
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", tool_calls=(PastCall("get_weather", '{"city": "Paris"}', "call_1"),)),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    )
    assert client.requests[0].guide_type is None
    assert client.requests[0].tools is None  # tool_choice none: no call is possible


# What the client libraries send (issue 37) ----------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
async def test_null_optional_fields_take_their_defaults(
    http: httpx.AsyncClient, client: ScriptedClient, path: str
) -> None:
    """The SDK sends null for arguments passed as None, guidance always sends "top_p": null."""
    nulls = dict.fromkeys(("temperature", "top_p", "n", "presence_penalty", "frequency_penalty", "stream", "top_k"))
    request = await _constraint(http, client, path, **nulls, max_tokens=None)
    assert (request.temperature, request.top_p, request.top_k, request.stream) == (1.0, 1.0, 0, False)
    assert (request.presence_penalty, request.frequency_penalty) == (0.0, 0.0)
    assert request.max_tokens == (16 if path == COMPLETIONS else None)  # OpenAI's defaults: 16, and no limit


async def test_the_same_constraint_under_two_spellings_is_one(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    grammar = 'start: "yes" | "no"'
    request = await _constraint(
        http, client, COMPLETIONS, guided_grammar=grammar, structured_outputs={"grammar": grammar}
    )
    assert (request.guide_type, request.guide) == (GuideType.LARK, grammar)


UNIT_PARAMETERS: dict[str, Any] = {  # what pydantic writes for a model with an enum field
    "$defs": {"Unit": {"enum": ["c", "f"], "title": "Unit", "type": "string"}},
    "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}},
    "required": ["city", "unit"],
    "title": "Weather",
    "type": "object",
}
LEGACY_PARAMETERS: dict[str, Any] = {
    "definitions": {"Tz": {"type": "string", "enum": ["UTC", "CET"]}},
    "type": "object",
    "properties": {"tz": {"$ref": "#/definitions/Tz"}, "next": {"$ref": "#"}},
}


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
async def test_tool_parameters_keep_their_own_references(
    http: httpx.AsyncClient, client: ScriptedClient, tool_choice: str
) -> None:
    """Each function's schema keeps its own root: $defs, definitions and '#' itself resolve."""
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": UNIT_PARAMETERS}},
        {"type": "function", "function": {"name": "clock", "parameters": LEGACY_PARAMETERS}},
    ]
    request = await _constraint(http, client, CHAT, tools=tools, tool_choice=tool_choice)
    grammar = generic_grammar(request)
    prefix = TOOL_CALL_MARKER if tool_choice == "auto" else ""
    good = (
        '[{"name": "weather", "arguments": {"city": "Oslo", "unit": "c"}}, '
        '{"name": "clock", "arguments": {"tz": "UTC", "next": {"tz": "CET"}}}]'
    )
    assert accepts(grammar, prefix + good)
    assert not accepts(grammar, prefix + good.replace('"c"', '"kelvin"'))
    assert not accepts(grammar, prefix + good.replace('"CET"', '"PST"'))


LEGACY_FUNCTIONS = [tool["function"] for tool in TOOLS]


@pytest.mark.parametrize("stream", [False, True])
async def test_legacy_named_function_call(http: httpx.AsyncClient, client: ScriptedClient, stream: bool) -> None:
    """OpenAI's deprecated ``functions``: a named call is constrained and answered as ``function_call``."""
    client.script(_outputs('{"city": ', '"Paris"}'))
    fields = {"functions": LEGACY_FUNCTIONS, "function_call": {"name": "get_weather"}, "stream": stream}
    response = await http.post(CHAT, json=chat_body(**fields))
    (request,) = client.requests
    assert request.tools is not None and request.tools.mode is ToolMode.NAMED
    assert request.tools.functions[0].parameters["properties"] == WEATHER_PARAMETERS["properties"]
    if stream:
        events = sse_events(response)
        calls = [event["choices"][0]["delta"].get("function_call") for event in events]
        assert calls[1] == {"name": "get_weather", "arguments": '{"city": '}
        assert "".join(call["arguments"] for call in calls if call) == PARIS_ARGUMENTS
        assert all("tool_calls" not in event["choices"][0]["delta"] for event in events)
        assert events[-1]["choices"][0]["finish_reason"] == "function_call"
    else:
        choice = response.json()["choices"][0]
        assert choice["message"] == {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": PARIS_ARGUMENTS},
        }
        assert choice["finish_reason"] == "function_call"


@pytest.mark.parametrize("function_call", [None, "auto"])
async def test_legacy_functions_auto_make_one_call_or_answer(
    http: httpx.AsyncClient, client: ScriptedClient, function_call: str | None
) -> None:
    client.script(_outputs(TOOL_CALL_MARKER + TWO_CALLS[: TWO_CALLS.index("}}") + 2] + "]"))
    body = chat_body(functions=LEGACY_FUNCTIONS, function_call=function_call)
    choice = (await http.post(CHAT, json=body)).json()["choices"][0]
    assert choice["message"]["function_call"] == {"name": "get_weather", "arguments": PARIS_ARGUMENTS}
    assert choice["finish_reason"] == "function_call"
    (request,) = client.requests
    assert request.tools is not None and request.tools.mode is ToolMode.AUTO
    # one call at most, as the deprecated API returns one
    assert request.tools.parallel is False
    assert not accepts(generic_grammar(request), TOOL_CALL_MARKER + TWO_CALLS)
    client.script(_outputs("Sunny."))
    choice = (await http.post(CHAT, json=body)).json()["choices"][0]
    assert (choice["message"], choice["finish_reason"]) == ({"role": "assistant", "content": "Sunny."}, "stop")


async def test_legacy_function_none_and_function_results(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": PARIS_ARGUMENTS}},
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    request = await _constraint(http, client, CHAT, messages=messages, functions=LEGACY_FUNCTIONS, function_call="none")
    assert (request.guide_type, request.guide) == (None, None)
    assert request.messages is not None
    assert [m.role for m in request.messages] == ["user", "assistant", "tool"]
    assert request.messages[1].tool_calls == (PastCall("get_weather", '{"city": "Paris"}'),)
    assert request.messages[2].content == "sunny"
    assert request.tools is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"function_call": {"name": "get_weather"}}, "function_call"),
        ({"functions": LEGACY_FUNCTIONS, "function_call": {"name": "nope"}}, "tool_choice"),
        ({"functions": LEGACY_FUNCTIONS, "tools": TOOLS}, "functions"),
    ],
)
async def test_legacy_function_calling_errors(
    http: httpx.AsyncClient, client: ScriptedClient, fields: dict[str, Any], param: str
) -> None:
    assert_error(await http.post(CHAT, json=chat_body(**fields)), 400, "invalid_request_error", param=param)
    assert client.requests == []


async def test_legacy_fields_sent_as_null_are_fine(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    await _constraint(http, client, CHAT, functions=None, function_call=None)


# Structural tags ------------------------------------------------------------------------------

WEATHER_TAG: dict[str, Any] = {
    "structures": [{"begin": "<function=get_weather>", "schema": SCHEMA, "end": "</function>"}],
    "triggers": ["<function="],
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "structural_tag", **WEATHER_TAG}},
        {"structured_outputs": {"structural_tag": json.dumps(WEATHER_TAG)}},
    ],
)
async def test_a_structural_tag_travels_as_its_own_guide_type(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, fields: dict[str, Any]
) -> None:
    request = await _constraint(http, client, path, **fields)
    assert request.guide_type is GuideType.STRUCTURAL_TAG and request.guide is not None
    assert json.loads(request.guide) == WEATHER_TAG
    grammar = grammar_for(request.guide_type, request.guide)  # what the backend then enforces
    assert accepts(grammar, 'Sure. <function=get_weather>{"name":"Ada"}</function>')
    assert not accepts(grammar, 'Sure. <function=get_weather>{"age":3}</function>')


async def test_a_structural_tag_on_the_responses_api(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    body = {"model": MODEL, "input": "x", "store": False, "text": {"format": {"type": "structural_tag", **WEATHER_TAG}}}
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert client.requests[0].guide_type is GuideType.STRUCTURAL_TAG
    assert json.loads(client.requests[0].guide or "") == WEATHER_TAG


@pytest.mark.parametrize(
    ("tag", "problem"),
    [
        ({"structures": [], "triggers": ["<f"]}, "structures"),
        ({**WEATHER_TAG, "triggers": ["<tool_call>"]}, "starts with none of the triggers"),
        ({**WEATHER_TAG, "structures": [{"begin": "<function=f>", "schema": {"type": "nope"}}]}, "nope"),
    ],
)
async def test_a_bad_structural_tag_is_a_400_saying_why(
    http: httpx.AsyncClient, client: ScriptedClient, tag: dict[str, Any], problem: str
) -> None:
    response = await http.post(CHAT, json=chat_body(response_format={"type": "structural_tag", **tag}))
    error = assert_error(response, 400, "invalid_request_error", code="invalid_constraint", param="response_format")
    assert problem in error["message"]
    assert client.requests == []


_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
_TOOL = {"type": "function", "function": {"name": "f", "parameters": _SCHEMA}}
_COMPILING = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": _SCHEMA}}},
    {"response_format": {"type": "structural_tag", "structures": [], "triggers": []}},
    {"structured_outputs": {"regex": "a+"}},
    {"guided_json": _SCHEMA},
    {"guided_regex": "a+"},
    {"guided_choice": ["yes", "no"]},
    {"guided_grammar": 'start: "a"'},
]


@pytest.mark.parametrize("fields", _COMPILING, ids=lambda fields: next(iter(fields)))
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_request_that_compiles_a_grammar_never_translates_on_the_event_loop(
    fields: dict[str, Any], kind: str
) -> None:
    """A grammar's compile can take seconds: on the event loop it would stall every stream and /health."""
    if kind == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
        assert not translates_quickly(ChatCompletionRequest.model_validate(body))
    else:
        assert not translates_quickly(CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields}))


def test_only_plain_requests_translate_on_the_event_loop() -> None:
    hi = [{"role": "user", "content": "hi"}]
    assert translates_quickly(ChatCompletionRequest.model_validate({"model": "m", "messages": hi}))
    assert translates_quickly(
        ChatCompletionRequest.model_validate({"model": "m", "messages": hi, "response_format": {"type": "text"}})
    )
    assert translates_quickly(CompletionRequest.model_validate({"model": "m", "prompt": "hi"}))
    assert not translates_quickly(
        ChatCompletionRequest.model_validate({"model": "m", "messages": hi, "tools": [_TOOL]})
    )
    legacy = {"model": "m", "messages": hi, "functions": [_TOOL["function"]]}
    assert not translates_quickly(ChatCompletionRequest.model_validate(legacy))
    long_chat = {"model": "m", "messages": hi * 40}
    assert not translates_quickly(ChatCompletionRequest.model_validate(long_chat))
    assert translates_quickly(CompletionRequest.model_validate({"model": "m", "prompt": [5] * 100}))
    for long_ids in ([5] * 100_000, [[5] * 100_000]):  # copying them would hold every stream
        assert not translates_quickly(CompletionRequest.model_validate({"model": "m", "prompt": long_ids}))
