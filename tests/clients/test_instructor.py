"""instructor: its documented modes, each with a model whose schema has $defs."""

from __future__ import annotations

from collections.abc import Iterable

import instructor
import openai
import pytest
from instructor.core.exceptions import IncompleteOutputException
from pydantic import BaseModel

from tests.clients.conftest import function_calls
from tests.clients.models import PROMPT, WEATHER_PROMPT, Person, WeatherQuery

MAX_TOKENS = 120


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.TOOLS_STRICT, instructor.Mode.JSON_SCHEMA])
def test_response_model(client: openai.OpenAI, model: str, mode: instructor.Mode) -> None:
    patched = instructor.from_openai(client, mode=mode)
    answer = patched.chat.completions.create(
        model=model,
        response_model=WeatherQuery,
        messages=[{"role": "user", "content": WEATHER_PROMPT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        max_retries=1,  # one attempt: the constraint must make the first one valid
    )
    assert isinstance(answer, WeatherQuery)


def test_parallel_tools(client: openai.OpenAI, model: str) -> None:
    """instructor sends ``tool_choice: auto``; the 135M model, untrained on our call format, may answer in
    text instead, which instructor reports as incomplete. Either way the server keeps the protocol."""
    patched = instructor.from_openai(client, mode=instructor.Mode.PARALLEL_TOOLS)
    try:
        answers = patched.chat.completions.create(
            model=model,
            response_model=Iterable[WeatherQuery | Person],
            messages=[{"role": "user", "content": f"{WEATHER_PROMPT} {PROMPT}"}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            max_retries=1,
        )
        found = list(answers)
    except IncompleteOutputException as incomplete:
        message = incomplete.last_completion.choices[0].message
        assert not message.tool_calls and "<tool_call>" not in (message.content or "")
    else:
        assert found and all(isinstance(answer, WeatherQuery | Person) for answer in found)


def test_parallel_calls_of_two_schemas_validate(client: openai.OpenAI, model: str) -> None:
    """What PARALLEL_TOOLS parses, with the calls required: each call validates against its own model."""
    models: dict[str, type[BaseModel]] = {"WeatherQuery": WeatherQuery, "Person": Person}
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"{WEATHER_PROMPT} {PROMPT}"}],
        tools=[openai.pydantic_function_tool(WeatherQuery), openai.pydantic_function_tool(Person)],
        tool_choice="required",
        max_tokens=2 * MAX_TOKENS,
        temperature=0,
    )
    calls = function_calls(completion.choices[0].message)
    assert calls and completion.choices[0].finish_reason == "tool_calls"
    for call in calls:
        models[call.function.name].model_validate_json(call.function.arguments)


def test_create_partial_streams_growing_models(client: openai.OpenAI, model: str) -> None:
    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    partials = list(
        patched.chat.completions.create_partial(
            model=model,
            response_model=Person,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            max_retries=1,
        )
    )
    assert len(partials) > 1
    final = Person.model_validate(partials[-1].model_dump())
    assert final.name
