"""Tool calls in the model's own format, end to end: SmolLM2 served with a Hermes-style chat template.

The server renders the tools through the template's tools section, constrains the calls to the
template's ``<tool_call>`` syntax and reads them back; clients see OpenAI's ``tool_calls`` either way.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.e2e.test_triton_grpc import run_stream, tensor, text_of
from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def sdk(hermes_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=hermes_server.openai_base_url, api_key="unused")


def streamed(sdk: openai.OpenAI, **fields: Any) -> tuple[str, list[tuple[str, str]], str | None]:
    """A streamed completion's content, its calls reassembled by index, and its finish reason."""
    content, reason = "", None
    calls: dict[int, tuple[str, str]] = {}
    for chunk in sdk.chat.completions.create(model=MODEL, stream=True, **fields):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            name, arguments = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
        reason = chunk.choices[0].finish_reason or reason
    return content, [calls[index] for index in sorted(calls)], reason


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_forced_calls_are_tool_calls_whole_and_streamed(sdk: openai.OpenAI, tool_choice: Any) -> None:
    fields: dict[str, Any] = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": tool_choice}
    fields |= {"max_tokens": 96, "temperature": 0}
    whole = sdk.chat.completions.create(model=MODEL, **fields).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content is None
    calls = [(call.function.name, call.function.arguments) for call in whole.message.tool_calls or []]
    assert calls and all(name in ("get_weather", "get_time") for name, _ in calls)
    for name, arguments in calls:  # each call's arguments are valid under its schema
        required = "city" if name == "get_weather" else "tz"
        assert isinstance(json.loads(arguments)[required], str)
    assert streamed(sdk, **fields) == ("", calls, "tool_calls")


def test_parallel_tool_calls_false_is_at_most_one_call(sdk: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}
    choice = sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=96, temperature=0, **fields).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls or []) == 1


def test_auto_answers_in_text_or_calls_and_the_syntax_never_reaches_content(sdk: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"messages": ASK, "tools": [WEATHER], "max_tokens": 48, "temperature": 0}
    whole = sdk.chat.completions.create(model=MODEL, **fields).choices[0]
    content, calls, reason = streamed(sdk, **fields)
    assert "<tool_call>" not in (whole.message.content or "") and "<tool_call>" not in content
    assert (content or None, reason) == (whole.message.content or None, whole.finish_reason)
    assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]


def test_a_tool_round_trip_renders_the_call_and_its_result_through_the_template(sdk: openai.OpenAI) -> None:
    forced: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    first = sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0, **forced).choices[0]
    (call,) = first.message.tool_calls or []
    conversation: list[Any] = [
        *ASK,
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21°C"},
    ]
    after: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "none"}
    answer = sdk.chat.completions.create(
        model=MODEL, messages=conversation, max_tokens=24, temperature=0, **after
    ).choices[0]
    assert answer.message.content and answer.message.tool_calls is None


def test_a_triton_client_sends_the_tools_and_gets_the_calls_in_the_models_format(
    hermes_server: RunningServer,
) -> None:
    tools = {"functions": [WEATHER["function"]], "mode": "required", "parallel": False}
    received = run_stream(
        hermes_server,
        [
            tensor("chat_messages", json.dumps(ASK).encode(), "BYTES"),
            tensor("tools", json.dumps(tools).encode(), "BYTES"),
            tensor("max_tokens", 96, "INT32"),
            tensor("temperature", 0.0, "FP32"),
            tensor("stream", False, "BOOL"),
        ],
    )
    assert all(error is None for _, error in received)
    results = [result for result, _ in received if result.as_numpy("text_output") is not None]
    text = "".join(text_of(result) for result in results)
    assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")
    assert json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))["name"] == "get_weather"
    named = [result.as_numpy("tool_call_format") for result in results]
    assert named[0] is not None and named[0].reshape(-1)[0] == b"hermes"  # the first response names it
    assert all(value is None for value in named[1:])


def test_a_json_answer_holding_the_trigger_is_the_answer_not_a_call(sdk: openai.OpenAI) -> None:
    """Under auto with a JSON answer format, calls begin only where the output begins: a ``<tool_call>``
    inside the answer's string is text (the ``{`` bias makes the model answer rather than call)."""
    schema = {
        "type": "object",
        "properties": {"note": {"const": "see <tool_call> here"}},
        "required": ["note"],
        "additionalProperties": False,
    }
    fields: dict[str, Any] = {
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "note", "schema": schema}},
        "max_tokens": 40,
        "temperature": 0,
        "logit_bias": {"107": 100},  # "{": the answer's first token
    }
    whole = sdk.chat.completions.create(model=MODEL, **fields).choices[0]
    assert json.loads(whole.message.content or "") == {"note": "see <tool_call> here"}
    assert not whole.message.tool_calls and whole.finish_reason == "stop"
    content, calls, reason = streamed(sdk, **fields)
    assert (json.loads(content), calls, reason) == ({"note": "see <tool_call> here"}, [], "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_schema_the_models_grammar_cannot_hold_is_a_400_naming_tools(sdk: openai.OpenAI, stream: bool) -> None:
    """Only the backend builds the tools' grammar (in the model's format); its refusal is the 400, before any byte."""
    bad: Any = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "foo"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[bad], stream=stream)
    body: Any = refused.value.body
    assert (body["param"], body["code"]) == ("tools", "invalid_constraint")
    assert "Invalid type: foo" in body["message"]


def test_a_background_response_whose_tools_cannot_be_compiled_is_refused_at_create(sdk: openai.OpenAI) -> None:
    bad: Any = {"type": "function", "name": "get_weather", "parameters": {"type": "foo"}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input="Weather in Paris?", tools=[bad], background=True)
    body: Any = refused.value.body
    assert (body["param"], body["code"]) == ("tools", "invalid_constraint")
