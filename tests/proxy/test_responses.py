"""/v1/responses in front of a scripted generation client: the request as the chat completion it is
served as, the response and its stream as the official SDK reads them, and stored conversations."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
from starlette.applications import Starlette

from llgtriton import wire
from llgtriton.wire import GuideType
from tests.proxy.scripted import BASE_URL, MODEL, ScriptedClient, assert_error, http_client, scripted_app, served
from tests.support.postgres import PostgresServer

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def said(
    *texts: str | tuple[str, str], finish: wire.FinishReason = wire.FinishReason.STOP, **first: Any
) -> list[wire.GenerationOutput]:
    """Outputs that write ``texts`` in turn, the last one finishing; ``first``: fields of the first output.
    A pair is (thinking, answer): a reasoning model's output, which the backend sends apart."""
    outputs = [
        wire.GenerationOutput(
            text=text if isinstance(text, str) else text[1],
            reasoning="" if isinstance(text, str) else text[0],
            prompt_tokens=5,
            completion_tokens=index + 1,
        )
        for index, text in enumerate(texts)
    ]
    outputs[0] = wire.GenerationOutput(**{**outputs[0].__dict__, **first})
    outputs[-1] = wire.GenerationOutput(**{**outputs[-1].__dict__, "finish_reason": finish})
    return outputs


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "responses.sqlite3"


@pytest.fixture
def app(client: ScriptedClient, store: Path) -> Starlette:
    return scripted_app(client, responses_store=store)


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(app) as http:
        yield http


def sdk_for(app: Starlette, key: str = "x") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{BASE_URL}/v1",
        api_key=key,
        max_retries=0,
        http_client=http_client(app),  # type: ignore[arg-type]
    )


@pytest.fixture
async def sdk(app: Starlette) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_for(app) as sdk_client:
        yield sdk_client


def chat_messages(request: wire.GenerationRequest) -> list[tuple[str, str]]:
    assert request.messages is not None
    return [(m.role, m.content) for m in request.messages]


async def test_text_input_and_instructions_are_a_chat_and_the_answer_is_output_text(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script(said("Hello", " world"))
    response = await sdk.responses.create(
        model=MODEL, input="Say hello", instructions="Be brief.", max_output_tokens=20, temperature=0.5
    )
    assert response.status == "completed" and response.object == "response"
    assert response.id.startswith("resp_")
    assert response.output_text == "Hello world"
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (5, 2, 7)
    sent = client.requests[0]
    assert chat_messages(sent) == [("system", "Be brief."), ("user", "Say hello")]
    assert (sent.max_tokens, sent.temperature) == (20, 0.5)


async def test_a_list_of_items_is_the_conversation(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    conversation: Any = [
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Salut"}]},
        {"role": "user", "content": "And bye?"},
    ]
    await sdk.responses.create(model=MODEL, input=conversation)
    assert chat_messages(client.requests[0]) == [
        ("developer", "Answer in French."),
        ("user", "Hi"),
        ("assistant", "Salut"),
        ("user", "And bye?"),
    ]


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


async def test_parse_returns_the_model_and_the_schema_is_enforced_closed(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script(said('{"city": "Paris", ', '"celsius": 21}'))
    parsed = await sdk.responses.parse(model=MODEL, input="Weather?", text_format=Weather)
    assert parsed.output_parsed == Weather(city="Paris", celsius=21)
    sent = client.requests[0]
    assert sent.guide_type is GuideType.JSON_SCHEMA and sent.guide is not None
    assert json.loads(sent.guide)["additionalProperties"] is False  # strict: objects are closed, as at OpenAI


async def test_json_object_format(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said("{}"))
    await sdk.responses.create(model=MODEL, input="JSON please", text={"format": {"type": "json_object"}})
    assert client.requests[0].guide_type is GuideType.JSON


async def test_a_function_call_is_an_output_item_and_its_result_continues_the_stored_conversation(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script(said('<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'))
    first = await sdk.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL])  # type: ignore[list-item]
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "completed")
    assert call.call_id.startswith("call_") and (call.id or "").startswith("fc_")
    tools = client.requests[0].tools
    assert tools is not None and [f.name for f in tools.functions] == ["get_weather"]

    client.script(said("It is sunny."))
    second = await sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert second.output_text == "It is sunny." and second.previous_response_id == first.id
    sent = client.requests[1]
    assert sent.messages is not None
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool"]
    assert sent.messages[1].tool_calls[0].id == call.call_id
    assert (sent.messages[2].tool_call_id, sent.messages[2].content) == (call.call_id, "sunny")
    listed = await sdk.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in listed.data] == ["message", "function_call", "function_call_output"]


@pytest.mark.parametrize(
    ("choice", "mode"),
    [("required", "required"), ({"type": "function", "name": "get_weather"}, "named"), ("auto", "auto")],
)
async def test_tool_choice_is_the_chat_tool_choice(
    http: httpx.AsyncClient, client: ScriptedClient, choice: Any, mode: str
) -> None:
    client.script(said('{"city": "Paris"}'))
    body = {"model": MODEL, "input": "x", "tools": [WEATHER_TOOL], "tool_choice": choice, "parallel_tool_calls": False}
    assert (await http.post("/v1/responses", json=body)).status_code == 200
    tools = client.requests[0].tools
    assert tools is not None and tools.mode.value == mode and not tools.parallel


async def test_tool_choice_none_sends_no_tools(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    body = {"model": MODEL, "input": "x", "tools": [WEATHER_TOOL], "tool_choice": "none"}
    assert (await http.post("/v1/responses", json=body)).status_code == 200
    assert client.requests[0].tools is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools.0.name"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input.0.call_id"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["file_search_call.results"]}, "include.0"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True, "store": False}, "background"),
        ({"tool_choice": {"type": "web_search_preview"}, "tools": [WEATHER_TOOL]}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "absent"}, "tools": [WEATHER_TOOL]}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
async def test_what_cannot_be_served_is_a_400_naming_the_field(
    http: httpx.AsyncClient, client: ScriptedClient, fields: dict[str, Any], param: str
) -> None:
    response = await http.post("/v1/responses", json={"model": MODEL, "input": "x", **fields})
    assert_error(response, 400, "invalid_request_error", param=param)
    assert client.requests == []


async def test_an_unknown_previous_response_is_a_404(http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "input": "x", "previous_response_id": "resp_absent"}
    assert_error(
        await http.post("/v1/responses", json=body), 404, "invalid_request_error", param="previous_response_id"
    )


async def test_a_huge_unknown_id_is_not_echoed_whole(http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "input": "x", "previous_response_id": "resp_" + "x" * 500_000}
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 404
    assert len(response.json()["error"]["message"]) < 2100 and len(response.content) < 3000


async def test_stored_responses_can_be_read_listed_and_deleted(sdk: openai.AsyncOpenAI) -> None:
    created = await sdk.responses.create(model=MODEL, input=[{"role": "user", "content": f"m{i}"} for i in range(3)])
    fetched = await sdk.responses.retrieve(created.id)
    assert fetched.output_text == created.output_text and fetched.id == created.id
    newest_first = await sdk.responses.input_items.list(created.id, limit=2)
    assert [item.content[0].text for item in newest_first.data] == ["m2", "m1"]  # type: ignore[union-attr,index]
    assert newest_first.has_more
    rest = await sdk.responses.input_items.list(created.id, after=newest_first.data[-1].id)
    assert [item.content[0].text for item in rest.data] == ["m0"]  # type: ignore[union-attr,index]
    await sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.delete(created.id)


async def test_store_false_keeps_nothing(sdk: openai.AsyncOpenAI) -> None:
    created = await sdk.responses.create(model=MODEL, input="x", store=False)
    assert created.to_dict()["store"] is False
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(created.id)


async def test_a_response_cut_by_max_output_tokens_is_incomplete(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script(said("Hel", finish=wire.FinishReason.LENGTH))
    response = await sdk.responses.create(model=MODEL, input="x", max_output_tokens=1)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Hel"


async def test_thinking_is_a_reasoning_item(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said(("Let me think", ""), ("", ""), "Paris", reasoning_format="deepseek_r1"))
    response = await sdk.responses.create(model=MODEL, input="Capital of France?")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "Let me think"
    assert response.output_text == "Paris"


async def test_reasoning_effort_none_turns_thinking_off(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    body = {"model": MODEL, "input": "x", "reasoning": {"effort": "none"}}
    assert (await http.post("/v1/responses", json=body)).status_code == 200
    assert client.requests[0].chat_template_kwargs == {"enable_thinking": False}


# Streaming ------------------------------------------------------------------------------------


async def test_the_stream_is_the_responses_event_sequence(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said("Hello", " world"))
    events = [event async for event in await sdk.responses.create(model=MODEL, input="x", stream=True)]
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == "Hello world" and completed.response.usage is not None
    stored = await sdk.responses.retrieve(completed.response.id)
    assert stored.output_text == "Hello world"


async def test_the_sdk_stream_helper_reads_calls_and_text(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said('Checking. <tool_call>[{"name": "get_weather", ', '"arguments": {"city": "Paris"}}]'))
    async with sdk.responses.stream(model=MODEL, input="x", tools=[WEATHER_TOOL]) as stream:  # type: ignore[list-item]
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output_text == "Checking. "
    call = final.output[1]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}


async def test_a_streamed_parse_returns_the_model(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said('{"city": "Oslo",', ' "celsius": -3}'))
    async with sdk.responses.stream(model=MODEL, input="x", text_format=Weather) as stream:
        final = await stream.get_final_response()
    assert final.output_parsed == Weather(city="Oslo", celsius=-3)


async def test_a_streamed_reasoning_model_streams_its_thinking(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said(("Hmm", ""), "Paris", reasoning_format="deepseek_r1"))
    events = [event async for event in await sdk.responses.create(model=MODEL, input="x", stream=True)]
    deltas = [(event.type, getattr(event, "delta", None)) for event in events if event.type.endswith(".delta")]
    assert deltas == [("response.reasoning_text.delta", "Hmm"), ("response.output_text.delta", "Paris")]
    assert events[-1].type == "response.completed"
    assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]


async def test_a_stream_cut_by_the_token_limit_ends_incomplete(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said("Hel", finish=wire.FinishReason.LENGTH))
    events = [event async for event in await sdk.responses.create(model=MODEL, input="x", stream=True)]
    assert events[-1].type == "response.incomplete"


async def test_a_failure_mid_stream_is_an_error_event_then_response_failed(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    from proxy.errors import ServiceUnavailableError

    client.script(said("Hello", " world"), error=ServiceUnavailableError("Triton went away"), error_after=1)
    response = await http.post("/v1/responses", json={"model": MODEL, "input": "x", "stream": True})
    frames = [frame for frame in response.text.split("\n\n") if frame]
    events = [json.loads(frame.split("data: ", 1)[1]) for frame in frames]
    names = [frame.split("\n")[0].removeprefix("event: ") for frame in frames]
    assert names == [event["type"] for event in events]  # every event is named by its type
    assert names[-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "Triton went away"
    assert events[-1]["response"]["status"] == "failed"
    assert "[DONE]" not in response.text


async def test_a_request_refused_before_the_stream_starts_gets_its_status(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    from proxy.errors import ServiceUnavailableError

    client.script(said("x"), error=ServiceUnavailableError("queue full"), error_after=0)
    response = await http.post("/v1/responses", json={"model": MODEL, "input": "x", "stream": True})
    assert_error(response, 503, "service_unavailable")


# Background, owners, restarts -----------------------------------------------------------------


async def wait_until_done(sdk: openai.AsyncOpenAI, response_id: str) -> Any:
    for _ in range(200):
        response = await sdk.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        await asyncio.sleep(0.02)
    raise AssertionError("the background response did not finish")


async def test_a_background_response_is_queued_then_completed(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(said("Hello", " world"))
    queued = await sdk.responses.create(model=MODEL, input="x", background=True)
    assert queued.status == "queued" and queued.background
    done = await wait_until_done(sdk, queued.id)
    assert (done.status, done.output_text) == ("completed", "Hello world")


class Slow(ScriptedClient):
    async def generate(self, request: wire.GenerationRequest, request_id: str) -> Any:
        self.requests.append(request)
        yield wire.GenerationOutput(text="Hel", prompt_tokens=1, completion_tokens=1)
        await asyncio.sleep(30)
        yield wire.GenerationOutput(
            text="lo", finish_reason=wire.FinishReason.STOP, prompt_tokens=1, completion_tokens=2
        )


async def test_a_background_response_can_be_cancelled(store: Path) -> None:
    app = scripted_app(Slow(), responses_store=store)
    async with sdk_for(app) as sdk:
        queued = await sdk.responses.create(model=MODEL, input="x", background=True)
        cancelled = await sdk.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        await asyncio.sleep(0.1)
        assert (await sdk.responses.retrieve(queued.id)).status == "cancelled"


async def test_only_a_background_response_can_be_cancelled(sdk: openai.AsyncOpenAI) -> None:
    created = await sdk.responses.create(model=MODEL, input="x")
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.cancel(created.id)


async def test_a_stored_response_is_read_only_with_the_key_that_made_it(client: ScriptedClient, store: Path) -> None:
    app = scripted_app(client, responses_store=store, api_key="key-a")
    async with sdk_for(app, "key-a") as owner:
        created = await owner.responses.create(model=MODEL, input="x")
        assert (await owner.responses.retrieve(created.id)).id == created.id
    keys = tmp_keys = store.parent / "keys"
    tmp_keys.write_text("key-a\nkey-b\n")
    two_keys = scripted_app(client, responses_store=store, api_key_file=keys)
    async with sdk_for(two_keys, "key-b") as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.create(model=MODEL, input="x", previous_response_id=created.id)
    async with sdk_for(two_keys, "key-a") as owner_again:
        assert (await owner_again.responses.retrieve(created.id)).id == created.id


async def test_a_stored_conversation_survives_a_restart(client: ScriptedClient, store: Path) -> None:
    async with sdk_for(scripted_app(client, responses_store=store)) as before:
        first = await before.responses.create(model=MODEL, input="My name is Ada.")
    # a new proxy process on the same file: what the old one stored is there
    async with sdk_for(scripted_app(client, responses_store=store)) as after:
        assert (await after.responses.retrieve(first.id)).output_text == first.output_text
        await after.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
    assert chat_messages(client.requests[-1]) == [
        ("user", "My name is Ada."),
        ("assistant", "Hello world"),
        ("user", "What is my name?"),
    ]


async def test_the_thinking_tokens_are_reported_in_the_usage(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    outputs = said(("Hmm", ""), "Paris", reasoning_format="deepseek_r1")
    outputs[-1] = wire.GenerationOutput(**{**outputs[-1].__dict__, "reasoning_tokens": 2})
    client.script(outputs)
    response = await sdk.responses.create(model=MODEL, input="x")
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 2
    chat = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert chat.usage is not None and chat.usage.completion_tokens_details is not None
    assert chat.usage.completion_tokens_details.reasoning_tokens == 2


async def test_an_error_the_stream_did_not_report_is_numbered_after_the_last_event() -> None:
    """Such as a store that fails once the output is complete: the ``error`` event continues the count."""
    from collections.abc import AsyncGenerator

    from pydantic import BaseModel

    from proxy.errors import ServiceUnavailableError
    from proxy.sse import EventStreamResponse

    class Event(BaseModel):
        type: str
        sequence_number: int

    async def events() -> AsyncGenerator[BaseModel]:
        for number in range(3):
            yield Event(type="response.output_text.delta", sequence_number=number)
        raise ServiceUnavailableError("the store failed")

    app = EventStreamResponse(events(), named=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        text = (await http.get("/")).text
    last = json.loads(text.strip().split("\n\n")[-1].split("data: ", 1)[1])
    assert (last["type"], last["sequence_number"]) == ("error", 3)


# A store that fails ---------------------------------------------------------------------------------


@pytest.fixture
def broken_store(tmp_path: Path) -> Path:
    """A store path that cannot be opened: its folder is a file."""
    (tmp_path / "a-file").write_text("not a folder")
    return tmp_path / "a-file" / "responses.sqlite3"


async def test_a_generated_response_the_store_cannot_keep_still_comes_back_marked_unstored(
    client: ScriptedClient, broken_store: Path
) -> None:
    async with sdk_for(scripted_app(client, responses_store=broken_store)) as sdk:
        client.script(said("Par", "is"))
        response = await sdk.responses.create(model=MODEL, input="Capital of France?")
        assert (response.status, response.output_text, response.to_dict()["store"]) == ("completed", "Paris", False)
        client.script(said("Par", "is"))
        events = [event async for event in await sdk.responses.create(model=MODEL, input="x", stream=True)]
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "Paris" and events[-1].response.to_dict()["store"] is False


@contextlib.contextmanager
def files_cannot_grow_past(limit: int) -> Iterator[None]:
    """As a full disk: a write that would make any file of this process larger than ``limit`` bytes
    fails (EFBIG, the file-size limit) instead of killing it (SIGXFSZ ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


async def test_a_full_sqlite_store_refuses_writes_with_a_503_and_still_delivers_and_reads(
    client: ScriptedClient, store: Path
) -> None:
    async with sdk_for(scripted_app(client, responses_store=store)) as sdk:
        client.script(said("Par", "is"))
        kept = await sdk.responses.create(model=MODEL, input="Capital of France?")
        files = [store, store.with_name(store.name + "-wal")]
        with files_cannot_grow_past(max(path.stat().st_size for path in files if path.exists())):
            long_input = "Say it again. " * 20_000  # more than the files may grow by
            client.script(said("Par", "is"))
            whole = await sdk.responses.create(model=MODEL, input=long_input)
            assert (whole.output_text, whole.to_dict()["store"]) == ("Paris", False)
            client.script(said("Par", "is"))
            events = [event async for event in await sdk.responses.create(model=MODEL, input=long_input, stream=True)]
            assert events[-1].type == "response.completed" and events[-1].response.to_dict()["store"] is False
            with pytest.raises(openai.InternalServerError) as refused:
                await sdk.responses.create(model=MODEL, input=long_input, background=True)
            assert refused.value.status_code == 503 and str(store) in refused.value.message
            assert (await sdk.responses.retrieve(kept.id)).output_text == "Paris"  # reads go on
        client.script(said("Par", "is"))
        again = await sdk.responses.create(model=MODEL, input=long_input)  # room again: stored again
        assert (await sdk.responses.retrieve(again.id)).output_text == "Paris"


async def test_reading_a_store_that_cannot_be_opened_is_a_503_naming_it(
    client: ScriptedClient, broken_store: Path
) -> None:
    async with http_client(scripted_app(client, responses_store=broken_store)) as http:
        for reply in (
            await http.get("/v1/responses/resp_1"),
            await http.post("/v1/responses", json={"model": MODEL, "input": "x", "background": True}),
            await http.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": "resp_1"}),
        ):
            assert reply.status_code == 503, reply.text
            assert str(broken_store) in reply.json()["error"]["message"]
    assert client.requests == []  # nothing was generated for requests that needed the store first


async def test_two_proxies_on_one_postgresql_share_conversations_and_background_responses(
    client: ScriptedClient, postgres: PostgresServer
) -> None:
    """As behind a load balancer: each turn may reach either proxy (each with its own store connections)."""
    database = postgres.new_database()
    first, second = scripted_app(client, responses_store=database), scripted_app(Slow(), responses_store=database)
    async with sdk_for(first) as on_first, sdk_for(second) as on_second:
        created = await on_first.responses.create(model=MODEL, input="My name is Ada.")
        assert (await on_second.responses.retrieve(created.id)).output_text == "Hello world"
        items = await on_second.responses.input_items.list(created.id)
        assert [item.content[0].text for item in items.data] == ["My name is Ada."]  # type: ignore[union-attr,index]
        continued = await on_first.responses.create(model=MODEL, input="Who am I?", previous_response_id=created.id)
        assert chat_messages(client.requests[-1]) == [
            ("user", "My name is Ada."),
            ("assistant", "Hello world"),
            ("user", "Who am I?"),
        ]
        await on_second.responses.delete(continued.id)
        with pytest.raises(openai.NotFoundError):
            await on_first.responses.retrieve(continued.id)

        queued = await on_second.responses.create(model=MODEL, input="x", background=True)  # a slow one
        assert (await on_first.responses.retrieve(queued.id)).status in ("queued", "in_progress")
        assert (await on_first.responses.cancel(queued.id)).status == "cancelled"
        await asyncio.sleep(0.1)
        assert (await on_second.responses.retrieve(queued.id)).status == "cancelled"


async def test_a_background_response_whose_proxy_died_is_failed_saying_why_by_the_next_reader(
    store_location: Path | str,
) -> None:
    dying = scripted_app(Slow(), responses_store=store_location, responses_stale_after_s=1.0)
    reader = scripted_app(ScriptedClient(), responses_store=store_location, responses_stale_after_s=1.0)
    async with sdk_for(reader) as on_reader:
        async with dying.router.lifespan_context(dying), sdk_for(dying) as on_dying:
            queued = await on_dying.responses.create(model=MODEL, input="x", background=True)
            await asyncio.sleep(1.6)  # past the limit: its proxy's signs of life keep it running
            assert (await on_reader.responses.retrieve(queued.id)).status == "in_progress"
        # Its proxy has stopped: the response stays in_progress until someone looks after the limit.
        assert (await on_reader.responses.retrieve(queued.id)).status == "in_progress"
        await asyncio.sleep(1.2)
        lost = await on_reader.responses.retrieve(queued.id)
        assert lost.status == "failed" and lost.error is not None
        assert (
            lost.error.code == "server_error" and "proxy running this background response stopped" in lost.error.message
        )
        assert (await on_reader.responses.retrieve(queued.id)).status == "failed"


async def test_a_stored_response_streams_again_and_resumes_after_a_sequence_number(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script(
        said(("Thinking.", ""), 'Checking. <tool_call>[{"name": "get_weather", ', '"arguments": {"city": "Paris"}}]')
    )
    created = await sdk.responses.create(model=MODEL, input="x", tools=[WEATHER_TOOL])  # type: ignore[list-item]
    events = [event async for event in await sdk.responses.retrieve(created.id, stream=True)]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[0].response.output == []
    final = events[-1]
    assert final.type == "response.completed" and final.response == created
    added = [event.item for event in events if event.type == "response.output_item.added"]
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.id for item in added] == [item.id for item in done] == [item.id for item in created.output]
    assert done == created.output
    texts = [event.delta for event in events if event.type == "response.output_text.delta"]
    arguments = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert "".join(texts) == created.output_text and json.loads("".join(arguments)) == {"city": "Paris"}

    resumed = [event async for event in await sdk.responses.retrieve(created.id, stream=True, starting_after=4)]
    assert [event.sequence_number for event in resumed] == list(range(5, len(events)))
    assert [event.type for event in resumed] == [event.type for event in events[5:]]


class Gated(ScriptedClient):
    """Writes its first output, then the rest once ``go`` is set: a generation still running while a test looks."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> Any:
        first = True
        async for output in super().generate(request, request_id):
            if not first:
                await self.go.wait()
            first = False
            yield output


@contextlib.asynccontextmanager
async def live_sdk(app: Starlette) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK in front of ``app`` served for real, so that a stream is read while it is written."""
    async with (
        served(app) as base_url,
        openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        yield sdk


def texts_of(events: list[Any]) -> str:
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


async def test_a_streamed_background_response_is_streamed_live_and_resumed_after_a_drop(store: Path) -> None:
    gated = Gated()
    gated.script(said("Hello", " wide", " world"))
    async with live_sdk(scripted_app(gated, responses_store=store)) as sdk:
        seen = []
        async for event in await sdk.responses.create(model=MODEL, input="x", background=True, stream=True):
            seen.append(event)
            if event.type == "response.output_text.delta":
                break  # the client's connection drops while the model is still writing
        assert [event.type for event in seen[:2]] == ["response.created", "response.in_progress"]
        assert seen[0].response.status == "queued" and seen[0].response.background  # type: ignore[union-attr]
        response_id = seen[0].response.id  # type: ignore[union-attr]
        assert (await sdk.responses.retrieve(response_id)).status == "in_progress"  # it goes on without the client

        gated.go.set()
        last = seen[-1].sequence_number
        resumed = [event async for event in await sdk.responses.retrieve(response_id, stream=True, starting_after=last)]
        numbers = [event.sequence_number for event in [*seen, *resumed]]
        assert numbers == list(range(len(numbers)))
        assert texts_of([*seen, *resumed]) == "Hello wide world"
        assert resumed[-1].type == "response.completed"
        done = await wait_until_done(sdk, response_id)
        assert done.output_text == "Hello wide world" and resumed[-1].response == done

        # Once it has ended, the same events again (not a replay made up from the result).
        again = [event async for event in await sdk.responses.retrieve(response_id, stream=True)]
        assert [event.model_dump() for event in again] == [event.model_dump() for event in [*seen, *resumed]]
        after_all = await sdk.responses.retrieve(response_id, stream=True, starting_after=numbers[-1])
        assert [event async for event in after_all] == []


async def test_a_streamed_background_response_is_followed_live_through_another_proxy(
    store_location: Path | str,
) -> None:
    """As behind a load balancer: the stream resumes on a proxy that is not the one generating."""
    gated = Gated()
    gated.script(said("Hello", " wide", " world"))
    running, other = (scripted_app(client, responses_store=store_location) for client in (gated, ScriptedClient()))
    async with live_sdk(running) as on_running, live_sdk(other) as on_other:
        stream = await on_running.responses.create(model=MODEL, input="x", background=True, stream=True)
        created = await anext(aiter(stream))
        await stream.close()
        follower = await on_other.responses.retrieve(created.response.id, stream=True, starting_after=0)  # type: ignore[union-attr]
        followed = []
        async for event in follower:
            followed.append(event)
            if texts_of(followed) == "Hello":  # seen through the store while the model is still writing
                assert (await on_other.responses.retrieve(created.response.id)).status == "in_progress"  # type: ignore[union-attr]
                gated.go.set()
        assert [event.sequence_number for event in followed] == list(range(1, len(followed) + 1))
        assert texts_of(followed) == "Hello wide world" and followed[-1].type == "response.completed"


async def test_a_cancelled_streamed_background_response_ends_its_stream_with_its_state(store: Path) -> None:
    gated = Gated()
    gated.script(said("Hello", " world"))
    async with live_sdk(scripted_app(gated, responses_store=store)) as sdk:
        events = []
        async for event in await sdk.responses.create(model=MODEL, input="x", background=True, stream=True):
            events.append(event)
            if event.type == "response.output_text.delta":
                await sdk.responses.cancel(events[0].response.id)  # type: ignore[union-attr]
        assert [event.sequence_number for event in events] == list(range(len(events)))
        assert texts_of(events) == "Hello"
        assert events[-1].type == "response.incomplete" and events[-1].response.status == "cancelled"


async def test_a_streamed_background_response_with_a_bad_constraint_is_refused_before_it_starts(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    reply = await http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "x",
            "background": True,
            "stream": True,
            "text": {
                "format": {"type": "json_schema", "name": "bad", "schema": {"type": "object", "minProperties": "x"}}
            },
        },
    )
    assert_error(reply, 400, "invalid_request_error", param="text.format")
    assert client.requests == []  # nothing was started


@pytest.mark.parametrize("stream", [False, True])
async def test_a_background_response_whose_tool_schema_cannot_compile_is_refused_at_create(
    http: httpx.AsyncClient, client: ScriptedClient, stream: bool
) -> None:
    bad = {**WEATHER_TOOL, "parameters": {"type": "foo"}}
    body = {"model": MODEL, "input": "x", "tools": [bad], "background": True, "stream": stream}
    error = assert_error(await http.post("/v1/responses", json=body), 400, "invalid_request_error", param="tools")
    assert error["code"] == "invalid_constraint" and "foo" in error["message"]
    assert client.requests == []  # nothing was queued


async def test_streaming_a_background_response_waits_for_it_to_end(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script(said("Hello", " world"))
    queued = await sdk.responses.create(model=MODEL, input="x", background=True)
    events = [event async for event in await sdk.responses.retrieve(queued.id, stream=True)]
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Hello world"


async def test_resuming_a_stream_is_checked_before_it_starts(http: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
    created = await sdk.responses.create(model=MODEL, input="x")
    reply = await http.get(f"/v1/responses/{created.id}", params={"starting_after": "3"})
    assert_error(reply, 400, "invalid_request_error", param="starting_after")
    reply = await http.get(f"/v1/responses/{created.id}", params={"stream": "true", "starting_after": "x"})
    assert_error(reply, 400, "invalid_request_error", param="starting_after")
    reply = await http.get("/v1/responses/resp_none", params={"stream": "true"})
    assert_error(reply, 404, "invalid_request_error", code="response_not_found")


async def test_a_failed_background_response_streams_again_as_an_error_then_response_failed(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    from proxy.errors import ServiceUnavailableError

    client.script(said("Hello", " world"), error=ServiceUnavailableError("Triton went away"), error_after=1)
    queued = await sdk.responses.create(model=MODEL, input="x", background=True)
    events = [event async for event in await sdk.responses.retrieve(queued.id, stream=True)]
    assert [event.type for event in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message == "Triton went away"  # type: ignore[union-attr]
    assert events[-1].response.status == "failed"  # type: ignore[union-attr]
    assert [event.sequence_number for event in events] == list(range(len(events)))
