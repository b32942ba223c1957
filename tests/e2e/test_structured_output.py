"""Structured output through the real path: openai SDK → proxy → Triton → llguidance → SmolLM2."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.test_triton_grpc import run_stream, tensor, text_of
from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK_PERSON: list[Any] = [{"role": "user", "content": "Give me JSON for a person named Ann who is 31."}]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
ASK_WEATHER: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("strict", [True, False])
def test_json_schema_is_enforced_strict_or_not(client: openai.OpenAI, strict: bool) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=ASK_PERSON,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": strict}},
    )
    jsonschema.validate(json.loads(response.choices[0].message.content or ""), PERSON)
    assert response.choices[0].finish_reason == "stop"


def test_json_schema_streamed(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK_PERSON,
            temperature=0.8,
            seed=3,
            stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object with its name and age."}],
        temperature=0,
        max_tokens=300,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(response.choices[0].message.content or ""), dict)


PRETTY_EXAMPLE = json.dumps({"name": "Tom", "age": 3}, indent=2)


@pytest.mark.parametrize(
    ("extra_body", "indented"), [({}, True), ({"structured_outputs": {"disable_any_whitespace": True}}, False)]
)
def test_json_object_follows_the_layout_the_prompt_shows(
    client: openai.OpenAI, extra_body: dict[str, Any], indented: bool
) -> None:
    """Bounded whitespace lets the model indent as the prompt does; compact JSON is the request's choice."""
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Reply with JSON like this:\n{PRETTY_EXAMPLE}\nNow describe a dog."}],
        temperature=0,
        max_tokens=120,
        response_format={"type": "json_object"},
        extra_body=extra_body,
    )
    content = response.choices[0].message.content or ""
    assert response.choices[0].finish_reason == "stop", content
    assert isinstance(json.loads(content), dict)
    assert ("\n" in content) is indented


@pytest.mark.parametrize(
    ("structured", "check"),
    [
        ({"regex": r"\d{3}-\d{4}"}, lambda text: re.fullmatch(r"\d{3}-\d{4}", text)),
        ({"choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
        (
            {"grammar": 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]+/'},
            lambda t: re.fullmatch(r"The answer is \d+\.", t),
        ),
        ({"json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) is None),
    ],
)
def test_structured_outputs_extension(client: openai.OpenAI, structured: dict[str, Any], check: Any) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=ASK_PERSON, temperature=0, extra_body={"structured_outputs": structured}
    )
    assert check(response.choices[0].message.content), response.choices[0].message.content


def test_completions_take_constraints_too(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL, prompt="My phone number is", temperature=0, extra_body={"guided_regex": r" \d{3}-\d{4}"}
    )
    assert re.fullmatch(r" \d{3}-\d{4}", response.choices[0].text)


def test_named_tool_call(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        temperature=0,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


def test_required_tool_calls_streamed_match_whole(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK_WEATHER,
        "temperature": 0,
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    whole = client.chat.completions.create(**kwargs)
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) == 1 and whole.choices[0].finish_reason == "tool_calls"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
    jsonschema.validate(json.loads(calls[0].function.arguments), schemas[calls[0].function.name])

    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = streamed.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tool_choice_gives_text_or_valid_calls(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(  # 64 tokens hold a call; greedy SmolLM2 answers in text, cut there
        model=MODEL, messages=ASK_WEATHER, temperature=0, max_tokens=64, tools=[WEATHER_TOOL]
    )
    message = response.choices[0].message
    if message.tool_calls:
        assert response.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            assert call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    else:
        assert message.content and not message.content.startswith("<tool_call>")


def test_bad_constraints_are_400s_naming_the_problem(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="regex"):
        client.chat.completions.create(
            model=MODEL, messages=ASK_PERSON, extra_body={"structured_outputs": {"regex": "[unclosed"}}
        )
    with pytest.raises(openai.BadRequestError, match="unknown name"):
        client.chat.completions.create(
            model=MODEL, messages=ASK_PERSON, extra_body={"structured_outputs": {"grammar": "start: nope"}}
        )
    assert client.chat.completions.create(model=MODEL, messages=ASK_PERSON, max_tokens=2).choices


def guided_on_the_wire(server: RunningServer, prompt: bytes, max_tokens: int, guide_type: bytes, guide: Any) -> str:
    """The text of a greedy generation a Triton client constrains with the guided-decoding tensors."""
    received = run_stream(
        server,
        [
            tensor("text_input", prompt, "BYTES"),
            tensor("max_tokens", max_tokens, "INT32"),
            tensor("temperature", 0.0, "FP32"),
            tensor("guided_decoding_guide_type", guide_type, "BYTES"),
            tensor("guided_decoding_guide", json.dumps(guide).encode(), "BYTES"),
        ],
    )
    (result, error), *_ = received
    assert error is None
    return text_of(result)


def test_triton_clients_use_guided_decoding_tensors(server: RunningServer) -> None:
    text = guided_on_the_wire(server, b"Ann is 31 years old. As JSON:", 60, b"json_schema", PERSON)
    jsonschema.validate(json.loads(text), PERSON)


def test_triton_backend_refuses_a_bad_guide(server: RunningServer) -> None:
    received = run_stream(
        server,
        [
            tensor("text_input", b"x", "BYTES"),
            tensor("guided_decoding_guide_type", b"regex", "BYTES"),
            tensor("guided_decoding_guide", b"[unclosed", "BYTES"),
        ],
    )
    (_, error), *_ = received
    assert error is not None and "regex" in str(error)
    assert error.message().startswith("[invalid_argument] ")  # the kind the proxy maps to 400


# Every space opens a structure: " <", then 1 or 2, then ">". A model writes spaces, so the tag is used.
SPACED_TAG: dict[str, Any] = {
    "structures": [{"begin": " <", "schema": {"enum": [1, 2]}, "end": ">"}],
    "triggers": [" "],
}
SPACED = re.compile(r"[^ ]*( <[12]>[^ ]*)*( <[12]?)?")  # the last may be cut by max_tokens


def test_a_structural_tag_through_the_openai_api(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Paris in a sentence."}],
        temperature=0,
        max_tokens=24,
        extra_body={"response_format": {"type": "structural_tag", **SPACED_TAG}},  # (the SDK's type lacks it)
    )
    text = response.choices[0].message.content or ""
    assert " <" in text and SPACED.fullmatch(text), text


def test_a_structural_tag_on_the_triton_wire(server: RunningServer) -> None:
    text = guided_on_the_wire(server, b"Paris is a city in France. It is", 24, b"structural_tag", SPACED_TAG)
    assert " <" in text and SPACED.fullmatch(text), text


def pressure_of(choice: Any) -> dict[str, Any]:
    report: dict[str, Any] = choice.model_extra["grammar_pressure"]
    return report


def test_a_constrained_choice_reports_how_hard_its_grammar_pushed(client: openai.OpenAI) -> None:
    constrained = client.chat.completions.create(
        model=MODEL,
        messages=ASK_PERSON,
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        extra_body={"grammar_pressure": True},
    )
    report = pressure_of(constrained.choices[0])
    assert constrained.usage is not None and report["tokens"] == constrained.usage.completion_tokens
    assert 0.0 < report["mean_removed_mass"] <= report["max_removed_mass"] <= 1.0  # JSON forbids most of a vocabulary
    assert 0 <= report["first_choice_forbidden"] <= report["tokens"]

    free = client.chat.completions.create(
        model=MODEL, messages=ASK_PERSON, temperature=0, max_tokens=8, extra_body={"grammar_pressure": True}
    )
    assert pressure_of(free.choices[0]) == {
        "tokens": 8,
        "mean_removed_mass": 0.0,
        "max_removed_mass": 0.0,
        "first_choice_forbidden": 0,
    }
    assert "grammar_pressure" not in (
        client.chat.completions.create(model=MODEL, messages=ASK_PERSON, max_tokens=2).choices[0].model_extra or {}
    )


def test_a_streamed_choice_reports_its_grammar_pressure_with_its_finish(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK_PERSON,
            temperature=0,
            max_tokens=60,
            stream=True,
            extra_body={"structured_outputs": {"regex": "[0-9]{3}"}, "grammar_pressure": True},
        )
    )
    finishing = [chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert len(finishing) == 1 and pressure_of(finishing[0])["tokens"] >= 3
    others = [chunk.choices[0] for chunk in chunks if chunk.choices and not chunk.choices[0].finish_reason]
    assert all("grammar_pressure" not in (choice.model_extra or {}) for choice in others)
