"""pydantic-ai: an agent's structured output by its default (an output tool), ToolOutput and NativeOutput,
with function tools beside it; and over the Responses API (OpenAIResponsesModel)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic_ai import Agent, ModelSettings, NativeOutput, ToolOutput, capture_run_messages
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from tests.clients.models import PROMPT, Person, Unit

SETTINGS = ModelSettings(max_tokens=120, temperature=0, parallel_tool_calls=False)
LIMITS = UsageLimits(request_limit=4)  # a model that keeps calling tools ends the run, not the test session


@pytest.fixture(scope="module")
def chat_model(base_url: str, model: str) -> OpenAIChatModel:
    return OpenAIChatModel(model, provider=OpenAIProvider(base_url=base_url, api_key="unused"))


def weather(city: str, unit: Unit) -> str:
    """The weather in a city."""
    return f"sunny in {city}, 20 degrees {unit.value}"


@pytest.mark.parametrize(
    "output", [Person, ToolOutput(Person), NativeOutput(Person)], ids=["default", "tool", "native"]
)
def test_structured_output(chat_model: OpenAIChatModel, output: object) -> None:
    agent = Agent(chat_model, output_type=output, model_settings=SETTINGS)
    result = agent.run_sync(PROMPT, usage_limits=LIMITS)
    assert isinstance(result.output, Person)


@pytest.mark.parametrize("output", [Person, NativeOutput(Person)], ids=["default", "native"])
def test_structured_output_with_tools(chat_model: OpenAIChatModel, output: object) -> None:
    """The agent calls its tool and continues the conversation; the 135M model may keep calling it until the
    usage limit ends the run. Every call it makes is well formed either way."""
    agent = Agent(chat_model, output_type=output, tools=[weather], model_settings=SETTINGS)
    with capture_run_messages() as messages:
        try:
            result = agent.run_sync(PROMPT, usage_limits=LIMITS)
        except UsageLimitExceeded:
            result = None
    if result is not None:
        assert isinstance(result.output, Person)
    calls = [part for message in messages for part in message.parts if isinstance(part, ToolCallPart)]
    for call in calls:
        if call.tool_name == "weather":
            assert set(call.args_as_dict()) == {"city", "unit"}
    assert result is not None or calls


def test_streamed_structured_output(chat_model: OpenAIChatModel) -> None:
    agent = Agent(chat_model, output_type=Person, model_settings=SETTINGS)

    async def run() -> list[Person]:
        async with agent.run_stream(PROMPT, usage_limits=LIMITS) as streamed:
            return [part async for part in streamed.stream_output()]

    parts = asyncio.run(run())
    assert parts and isinstance(parts[-1], Person)


def test_responses_structured_output(base_url: str, model: str) -> None:
    responses_model = OpenAIResponsesModel(model, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    agent = Agent(responses_model, output_type=Person, model_settings=SETTINGS)
    result = agent.run_sync(PROMPT, usage_limits=LIMITS)
    assert isinstance(result.output, Person)
