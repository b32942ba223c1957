"""The OpenAI Agents SDK over chat completions and over its default, the Responses API: ``output_type``
alone and beside a ``function_tool`` (call, tool result, final answer)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.clients.models import PROMPT, Person, Unit

set_tracing_disabled(True)  # the SDK would otherwise upload traces to OpenAI
SETTINGS = ModelSettings(max_tokens=120, temperature=0, parallel_tool_calls=False)


def _weather(city: str, unit: Unit) -> str:
    """The weather in a city."""
    return f"sunny in {city}, 20 degrees {unit.value}"


weather = function_tool(_weather)


@pytest.fixture
def chat_model(async_client: openai.AsyncOpenAI, model: str) -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(model=model, openai_client=async_client)


def test_output_type(chat_model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(name="describer", instructions="Describe people.", model=chat_model, output_type=Person,
                  model_settings=SETTINGS)  # fmt: skip
    result = Runner.run_sync(agent, PROMPT, max_turns=2)
    assert isinstance(result.final_output, Person)


def test_output_type_with_a_tool(chat_model: OpenAIChatCompletionsModel) -> None:
    """The canonical pattern: the model calls the tool or answers in the format. The 135M model may keep
    calling the tool until max_turns; every call is well formed and answered either way."""
    agent = Agent(name="describer", instructions="Describe people.", model=chat_model, output_type=Person,
                  tools=[weather], model_settings=SETTINGS)  # fmt: skip
    try:
        result = Runner.run_sync(agent, PROMPT, max_turns=3)
    except MaxTurnsExceeded as exceeded:
        assert exceeded.run_data is not None
        items = exceeded.run_data.new_items
        calls = [item for item in items if item.type == "tool_call_item"]
        outputs = [item for item in items if item.type == "tool_call_output_item"]
        assert calls and len(outputs) == len(calls)
    else:
        assert isinstance(result.final_output, Person)


def test_streamed_output_type(chat_model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(name="describer", instructions="Describe people.", model=chat_model, output_type=Person,
                  model_settings=SETTINGS)  # fmt: skip

    async def run() -> object:
        streamed = Runner.run_streamed(agent, PROMPT, max_turns=2)
        events = [event.type async for event in streamed.stream_events()]
        assert "raw_response_event" in events
        return streamed.final_output

    assert isinstance(asyncio.run(run()), Person)


@pytest.fixture
def responses_config(async_client: openai.AsyncOpenAI) -> RunConfig:
    """The SDK's default: a model by name, served through the Responses API."""
    return RunConfig(model_provider=OpenAIProvider(openai_client=async_client, use_responses=True))


def test_responses_output_type(model: str, responses_config: RunConfig) -> None:
    agent = Agent(name="describer", instructions="Describe people.", model=model, output_type=Person,
                  model_settings=SETTINGS)  # fmt: skip
    result = Runner.run_sync(agent, PROMPT, max_turns=2, run_config=responses_config)
    assert isinstance(result.final_output, Person)


def test_responses_tool_call_then_final_answer(model: str, responses_config: RunConfig) -> None:
    """The first turn must call the tool (tool_choice required); its result goes back as a
    function_call_output item, and the model answers in the format or calls again (tool_choice
    resets to auto, and the 135M model may keep calling until max_turns): every call is well
    formed and answered either way."""
    forced = ModelSettings(max_tokens=120, temperature=0, parallel_tool_calls=False, tool_choice="required")
    agent = Agent(name="describer", instructions="Describe people.", model=model, output_type=Person,
                  tools=[weather], model_settings=forced, reset_tool_choice=True)  # fmt: skip
    try:
        result = Runner.run_sync(agent, PROMPT, max_turns=2, run_config=responses_config)
    except MaxTurnsExceeded as exceeded:
        assert exceeded.run_data is not None
        kinds = [item.type for item in exceeded.run_data.new_items]
    else:
        kinds = [item.type for item in result.new_items]
        assert isinstance(result.final_output, Person)
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert kinds.count("tool_call_item") == kinds.count("tool_call_output_item")
