"""The Responses API end to end: the official SDK against the real server (SmolLM2 on CPU).

The model's answers are not under test; the shapes, the guarantees and the stored conversations are.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },  # bounded: one call fits its token budget whatever the model samples
    "strict": True,
}


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=20)
    population: int = Field(ge=0, le=10**9)  # bounded: the answer fits its token budget


def test_create_answers_in_text_and_reports_usage(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=8, temperature=0
    )  # greedy: a sampled answer may be an end token alone
    assert response.status in ("completed", "incomplete")
    assert response.output_text and response.usage is not None
    assert response.usage.output_tokens <= 8 and response.usage.input_tokens > 0
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"


def test_parse_returns_a_valid_model(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(model=MODEL, input="Describe Paris.", text_format=City, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, City)


def test_the_stream_helper_gets_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Describe Oslo.", text_format=City, max_output_tokens=60) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert isinstance(final.output_parsed, City)
    assert client.responses.retrieve(final.id).output_text == final.output_text  # stored by default


def test_a_tool_round_trip_through_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
    )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" for call in calls)
    assert isinstance(json.loads(calls[0].arguments)["city"], str)  # constrained by the tool's schema
    results: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"} for call in calls]
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=results, tools=[WEATHER], tool_choice="none",
        max_output_tokens=20, temperature=0,
    )  # fmt: skip
    assert second.output_text and not [item for item in second.output if item.type == "function_call"]
    listed = client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in listed.data] == [
        "message",
        *["function_call"] * len(calls),
        *["function_call_output"] * len(calls),
    ]


def test_the_tests_server_keeps_its_responses_beside_its_log(client: openai.OpenAI, server: RunningServer) -> None:
    """Not in the user's store (``~/.cache/llgtriton``), which a ``make serve`` beside the tests also uses."""
    client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, temperature=0)
    assert (server.log.parent / "responses.sqlite3").stat().st_size > 0


def test_without_storing_nothing_is_kept(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Again", previous_response_id=response.id)


def test_built_in_tools_are_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="Search the web", tools=[{"type": "web_search"}])
    assert refused.value.body["param"] == "tools.0.type"  # type: ignore[index]
