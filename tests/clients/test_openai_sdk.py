"""The openai SDK's structured-output helpers: ``parse``, the stream helper, ``pydantic_function_tool``."""

from __future__ import annotations

import openai

from tests.clients.conftest import function_calls
from tests.clients.models import PROMPT, WEATHER_PROMPT, Person, WeatherQuery

MAX_TOKENS = 120
AUTO_MAX_TOKENS = 48  # room for one call; the 135M model answers in text, cut here (seconds saved)


def test_parse_returns_the_model(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        response_format=Person,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, Person)
    assert completion.choices[0].finish_reason == "stop"


def test_the_stream_helper_returns_the_model(client: openai.OpenAI, model: str) -> None:
    with client.chat.completions.stream(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        response_format=Person,
        max_tokens=MAX_TOKENS,
        temperature=0,
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert {"content.delta", "content.done"} <= kinds
    assert isinstance(final.choices[0].message.parsed, Person)


def test_pydantic_function_tool_arguments_parse(client: openai.OpenAI, model: str) -> None:
    """The tool's schema has $defs (an enum and a nested model); strict, its arguments are parsed."""
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        tools=[openai.pydantic_function_tool(WeatherQuery)],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert calls and all(call.function.name == "WeatherQuery" for call in calls)
    assert all(isinstance(call.function.parsed_arguments, WeatherQuery) for call in calls)


def test_auto_gives_text_or_calls_that_validate(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        tools=[openai.pydantic_function_tool(WeatherQuery)],
        max_tokens=AUTO_MAX_TOKENS,
        temperature=0,
    )
    message = completion.choices[0].message
    if message.tool_calls:
        assert message.content is None
        for call in function_calls(message):
            WeatherQuery.model_validate_json(call.function.arguments)
    else:
        assert message.content and "<tool_call>" not in message.content


def test_parse_with_a_format_and_tools(client: openai.OpenAI, model: str) -> None:
    """OpenAI accepts both: the model calls a tool or answers in the format."""
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        response_format=Person,
        tools=[openai.pydantic_function_tool(WeatherQuery)],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    message = completion.choices[0].message
    if message.tool_calls:
        assert isinstance(message.tool_calls[0].function.parsed_arguments, WeatherQuery)
    else:
        assert isinstance(message.parsed, Person)


def test_streamed_tool_calls_accumulate(client: openai.OpenAI, model: str) -> None:
    with client.chat.completions.stream(
        model=model,
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        tools=[openai.pydantic_function_tool(WeatherQuery)],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
    ) as stream:
        done = [event for event in stream if event.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert done and all(isinstance(event.parsed_arguments, WeatherQuery) for event in done)
    calls = function_calls(final.choices[0].message)
    assert [call.function.arguments for call in calls] == [event.arguments for event in done]


def test_a_call_cut_short_is_still_a_call(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        tools=[openai.pydantic_function_tool(WeatherQuery)],
        tool_choice="required",
        max_tokens=8,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # call syntax never leaks into the content
    assert [call.function.name for call in function_calls(choice.message)] in ([], ["WeatherQuery"])
