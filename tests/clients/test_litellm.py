"""LiteLLM's OpenAI-compatible provider: a pydantic response_format, tools, streaming."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list at import
import litellm

from tests.clients.models import PROMPT, WEATHER_PROMPT, Person, WeatherQuery

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "WeatherQuery", "description": "The weather", "parameters": WeatherQuery.model_json_schema()},
}


@pytest.fixture(scope="module")
def options(base_url: str, model: str) -> dict[str, object]:
    return {"model": f"openai/{model}", "api_base": base_url, "api_key": "unused", "max_tokens": 120, "temperature": 0}


def test_response_format(options: dict[str, object]) -> None:
    response = litellm.completion(messages=[{"role": "user", "content": PROMPT}], response_format=Person, **options)
    Person.model_validate_json(response.choices[0].message.content)


def test_tools(options: dict[str, object]) -> None:
    response = litellm.completion(
        messages=[{"role": "user", "content": WEATHER_PROMPT}], tools=[WEATHER_TOOL], tool_choice="required", **options
    )
    calls = response.choices[0].message.tool_calls
    assert calls
    for call in calls:
        assert call.function.name == "WeatherQuery"
        WeatherQuery.model_validate_json(call.function.arguments)


def test_streamed_tool_call(options: dict[str, object]) -> None:
    chunks = list(
        litellm.completion(
            messages=[{"role": "user", "content": WEATHER_PROMPT}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "WeatherQuery"}},
            stream=True,
            **options,
        )
    )
    message = litellm.stream_chunk_builder(chunks).choices[0].message
    (call,) = message.tool_calls
    WeatherQuery.model_validate_json(call.function.arguments)
