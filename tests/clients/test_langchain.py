"""LangChain's ChatOpenAI: ``with_structured_output`` by every method, ``bind_tools`` by every tool_choice, streamed."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.clients.models import JSON_PROMPT, PROMPT, WEATHER_PROMPT, Person, WeatherQuery


@pytest.fixture(scope="module")
def chat(base_url: str, model: str) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0, max_tokens=120, max_retries=0)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output(chat: ChatOpenAI, method: str) -> None:
    answer = chat.with_structured_output(Person, method=method).invoke(PROMPT)
    assert isinstance(answer, Person)


def test_structured_output_json_mode(chat: ChatOpenAI) -> None:
    answer = chat.with_structured_output(None, method="json_mode").invoke(JSON_PROMPT)
    assert isinstance(answer, dict)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_streamed(chat: ChatOpenAI, method: str) -> None:
    parts = list(chat.with_structured_output(Person, method=method).stream(PROMPT))
    assert parts
    Person.model_validate(parts[-1] if isinstance(parts[-1], dict) else parts[-1].model_dump())


@pytest.mark.parametrize("tool_choice", ["required", "any", "WeatherQuery"])
@pytest.mark.parametrize("stream", [False, True])
def test_bind_tools_forced(chat: ChatOpenAI, tool_choice: str, stream: bool) -> None:
    bound = chat.bind_tools([WeatherQuery], tool_choice=tool_choice, parallel_tool_calls=False)
    if stream:
        message: Any = None
        for chunk in bound.stream(WEATHER_PROMPT):
            assert isinstance(chunk, AIMessageChunk)
            message = chunk if message is None else message + chunk
    else:
        message = bound.invoke(WEATHER_PROMPT)
    assert message.tool_calls, message
    assert message.content == ""  # call syntax never shows as the assistant's reply
    for call in message.tool_calls:
        assert call["name"] == "WeatherQuery"
        WeatherQuery.model_validate(call["args"])


def test_bind_tools_auto(chat: ChatOpenAI) -> None:
    # 48 tokens hold one call; the 135M model answers in text, which is cut there (seconds saved)
    message = chat.bind_tools([WeatherQuery], tool_choice="auto", max_tokens=48).invoke(WEATHER_PROMPT)
    if message.tool_calls:
        WeatherQuery.model_validate(message.tool_calls[0]["args"])
    else:
        assert isinstance(message.content, str) and "<tool_call>" not in message.content


def test_bind_tools_cut_short_is_a_call_not_content(chat: ChatOpenAI) -> None:
    """A call cut by max_tokens comes back as a (partial) call, never as the assistant's reply."""
    message: Any = chat.bind_tools([WeatherQuery], tool_choice="required", max_tokens=8).invoke(WEATHER_PROMPT)
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "length"
    calls = [*message.tool_calls, *message.invalid_tool_calls]
    assert all(call["name"] == "WeatherQuery" for call in calls)


@pytest.fixture(scope="module")
def responses_chat(base_url: str, model: str) -> ChatOpenAI:
    """ChatOpenAI in its Responses API mode."""
    return ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0, max_tokens=120, max_retries=0,
                      use_responses_api=True)  # fmt: skip


def test_responses_structured_output(responses_chat: ChatOpenAI) -> None:
    answer = responses_chat.with_structured_output(Person, method="json_schema").invoke(PROMPT)
    assert isinstance(answer, Person)
