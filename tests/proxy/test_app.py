"""The proxy's own mapping, in-process: OpenAI bodies -> GenerationRequest, outputs -> JSON / SSE, errors.

A scripted :class:`GenerationClient` stands in for Triton, so these tests cover what the proxy
itself does; the end-to-end tests run the same requests against a real Triton.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import Completion as SdkCompletion
from openai.types.chat import ChatCompletion as SdkChatCompletion
from openai.types.chat import ChatCompletionChunk as SdkChatCompletionChunk

from llgtriton import wire
from llgtriton.messages import ChatMessage
from proxy.errors import (
    InvalidRequestError,
    ProxyError,
    ServiceUnavailableError,
    UpstreamTimeoutError,
)
from tests.proxy.scripted import (
    HELLO_WORLD,
    MODEL,
    USER,
    ScriptedClient,
    assert_error,
    chat_body,
    completion_body,
    http_client,
    scripted_app,
    sse_events,
    tool,
)

# Request mapping ----------------------------------------------------------------------------


async def test_chat_body_maps_to_the_generation_request(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    body = chat_body(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "¿Qué tal? 😀"},
        ],
        max_tokens=100,
        max_completion_tokens=5,
        stop="END",
        top_k=-1,
        temperature=0.5,
        top_p=0.9,
        seed=2**64 - 1,
        presence_penalty=0.25,
        frequency_penalty=-0.5,
        user="someone",
        vendor_extension={"ignored": True},
    )
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert client.requests == [
        wire.GenerationRequest(
            messages=(
                ChatMessage("system", "Be brief."),
                ChatMessage("user", "Hi there"),
                ChatMessage("assistant", ""),
                ChatMessage("user", "¿Qué tal? 😀"),
            ),
            max_tokens=5,
            stream=False,
            temperature=0.5,
            top_p=0.9,
            top_k=0,
            seed=2**64 - 1,
            presence_penalty=0.25,
            frequency_penalty=-0.5,
            stop=("END",),
        )
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"max_tokens": 7}, 7),
        ({"max_completion_tokens": 9}, 9),
        ({"max_tokens": 7, "max_completion_tokens": 3}, 3),
    ],
)
async def test_chat_max_completion_tokens_wins_over_max_tokens(
    http: httpx.AsyncClient, client: ScriptedClient, fields: dict[str, int], expected: int | None
) -> None:
    assert (await http.post("/v1/chat/completions", json=chat_body(**fields))).status_code == 200
    assert client.requests[0].max_tokens == expected


async def test_chat_defaults(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    assert (await http.post("/v1/chat/completions", json=chat_body())).status_code == 200
    assert client.requests == [wire.GenerationRequest(messages=(ChatMessage("user", "Say hello"),))]


async def test_completion_body_maps_to_the_generation_request(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    response = await http.post(
        "/v1/completions",
        json=completion_body(prompt=["A list of one prompt"], stop=["a", "", "b"], top_k=5, seed=0, stream=True),
    )
    sse_events(response)
    assert client.requests == [
        wire.GenerationRequest(
            prompt="A list of one prompt", max_tokens=16, stream=True, top_k=5, seed=0, stop=("a", "b")
        )
    ]


@pytest.mark.parametrize(("fields", "expected"), [({}, 16), ({"max_tokens": 200}, 200)])
async def test_completion_max_tokens_defaults_to_16(
    http: httpx.AsyncClient, client: ScriptedClient, fields: dict[str, int], expected: int
) -> None:
    assert (await http.post("/v1/completions", json=completion_body(**fields))).status_code == 200
    assert client.requests[0].max_tokens == expected


async def test_each_generation_gets_its_own_request_id(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    first = (await http.post("/v1/chat/completions", json=chat_body())).json()
    second = (await http.post("/v1/completions", json=completion_body())).json()
    assert client.request_ids == [first["id"], second["id"]]
    assert first["id"].startswith("chatcmpl-")
    assert second["id"].startswith("cmpl-")
    assert first["id"] != second["id"]


# Non-streaming responses --------------------------------------------------------------------


async def test_chat_completion_response(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


async def test_completion_response_with_length_finish(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script([wire.GenerationOutput("Once", wire.FinishReason.LENGTH, prompt_tokens=3, completion_tokens=16)])
    body = (await http.post("/v1/completions", json=completion_body())).json()
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": "Once", "finish_reason": "length", "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19}


# Streaming ----------------------------------------------------------------------------------


async def test_chat_stream_framing(http: httpx.AsyncClient) -> None:
    events = sse_events(await http.post("/v1/chat/completions", json=chat_body(stream=True)))
    assert [event["object"] for event in events] == ["chat.completion.chunk"] * len(events)
    assert len({event["id"] for event in events}) == 1
    assert {event["model"] for event in events} == {MODEL}
    deltas = [event["choices"][0]["delta"] for event in events]
    reasons = [event["choices"][0]["finish_reason"] for event in events]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(delta["content"] or "" for delta in deltas) == "Hello world"
    assert reasons == [None] * (len(events) - 1) + ["stop"]
    assert deltas[-1] == {"role": None, "content": None}
    # No usage chunk unless asked for.
    assert all(event["choices"] and event["usage"] is None for event in events)


async def test_chat_stream_usage_chunk_with_include_usage(http: httpx.AsyncClient) -> None:
    events = sse_events(
        await http.post("/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True}))
    )
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert all(event["usage"] is None for event in events[:-1])


async def test_chat_stream_include_usage_false_sends_no_usage_chunk(http: httpx.AsyncClient) -> None:
    events = sse_events(
        await http.post("/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": False}))
    )
    assert all(event["choices"] for event in events)


async def test_completion_stream_framing(http: httpx.AsyncClient) -> None:
    events = sse_events(await http.post("/v1/completions", json=completion_body(stream=True)))
    assert {event["object"] for event in events} == {"text_completion"}
    assert len({event["id"] for event in events}) == 1
    assert "".join(event["choices"][0]["text"] for event in events) == "Hello world"
    assert [event["choices"][0]["finish_reason"] for event in events][-1] == "stop"
    assert all(event["choices"] for event in events)


async def test_completion_stream_usage_chunk_with_include_usage(http: httpx.AsyncClient) -> None:
    body = completion_body(stream=True, stream_options={"include_usage": True})
    events = sse_events(await http.post("/v1/completions", json=body))
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


async def test_stream_of_a_generation_that_finishes_without_text(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    client.script([wire.GenerationOutput("", wire.FinishReason.STOP, prompt_tokens=4, completion_tokens=0)])
    events = sse_events(await http.post("/v1/chat/completions", json=chat_body(stream=True)))
    assert [event["choices"][0]["delta"] for event in events] == [
        {"role": "assistant", "content": ""},
        {"role": None, "content": None},
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


@settings(deadline=None, max_examples=25)
@given(st.lists(st.text(max_size=8), min_size=1, max_size=6), st.sampled_from(list(wire.FinishReason)))
def test_streamed_and_whole_responses_carry_the_same_text(deltas: list[str], reason: wire.FinishReason) -> None:
    outputs = [wire.GenerationOutput(text) for text in deltas[:-1]]
    outputs.append(wire.GenerationOutput(deltas[-1], reason, prompt_tokens=1, completion_tokens=len(deltas)))

    async def run() -> None:
        client = ScriptedClient()
        client.script(outputs)
        async with http_client(scripted_app(client)) as http:
            whole = (await http.post("/v1/chat/completions", json=chat_body())).json()
            events = sse_events(await http.post("/v1/chat/completions", json=chat_body(stream=True)))
            text = (await http.post("/v1/completions", json=completion_body())).json()
            text_events = sse_events(await http.post("/v1/completions", json=completion_body(stream=True)))
        assert whole["choices"][0]["message"]["content"] == "".join(deltas)
        assert whole["choices"][0]["finish_reason"] == reason.value
        assert "".join(event["choices"][0]["delta"]["content"] or "" for event in events) == "".join(deltas)
        assert events[-1]["choices"][0]["finish_reason"] == reason.value
        assert text["choices"][0]["text"] == "".join(deltas)
        assert "".join(event["choices"][0]["text"] for event in text_events) == "".join(deltas)

    asyncio.run(run())


# Errors from the backend --------------------------------------------------------------------

BACKEND_ERRORS = [
    (InvalidRequestError("the prompt is too long", param="messages"), 400, "invalid_request_error"),
    (ServiceUnavailableError("Triton is unavailable: connection refused"), 503, "service_unavailable"),
    (UpstreamTimeoutError("deadline exceeded"), 504, "timeout"),
]


@pytest.mark.parametrize(("error", "status", "error_type"), BACKEND_ERRORS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_error_before_any_output_gets_an_http_status(
    *,
    http: httpx.AsyncClient,
    client: ScriptedClient,
    error: ProxyError,
    status: int,
    error_type: str,
    path: str,
    stream: bool,
) -> None:
    client.script(HELLO_WORLD, error=error, error_after=0)
    body = chat_body(stream=stream) if "chat" in path else completion_body(stream=stream)
    assert_error(await http.post(path, json=body), status, error_type, message=error.message, param=error.param)


async def test_error_after_output_in_a_whole_response_gets_an_http_status(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    client.script(HELLO_WORLD, error=ServiceUnavailableError("Triton went away"), error_after=1)
    assert_error(await http.post("/v1/chat/completions", json=chat_body()), 503, "service_unavailable")


@pytest.mark.parametrize(("error", "status", "error_type"), BACKEND_ERRORS)
async def test_chat_error_after_output_is_an_sse_error_event_then_done(
    http: httpx.AsyncClient, client: ScriptedClient, error: ProxyError, status: int, error_type: str
) -> None:
    client.script(HELLO_WORLD, error=error, error_after=1)
    events = sse_events(await http.post("/v1/chat/completions", json=chat_body(stream=True)))
    assert [event["choices"][0]["delta"] for event in events[:-1]] == [
        {"role": "assistant", "content": ""},
        {"role": None, "content": "Hello"},
    ]
    assert events[-1] == {
        "error": {"message": error.message, "type": error_type, "param": error.param, "code": error.code}
    }


async def test_completion_error_after_output_is_an_sse_error_event_then_done(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    client.script(HELLO_WORLD, error=ServiceUnavailableError("Triton went away"), error_after=2)
    events = sse_events(await http.post("/v1/completions", json=completion_body(stream=True)))
    assert [event["choices"][0]["text"] for event in events[:-1]] == ["Hello", " world"]
    assert events[-1]["error"]["type"] == "service_unavailable"
    assert events[-1]["error"]["message"] == "Triton went away"


async def test_unexpected_exception_is_a_500_without_internals(client: ScriptedClient) -> None:
    client.script(HELLO_WORLD, error=RuntimeError("secret internal detail"), error_after=0)
    async with http_client(scripted_app(client), raise_app_exceptions=False) as http:
        response = await http.post("/v1/chat/completions", json=chat_body())
    error = assert_error(response, 500, "internal_error")
    assert "secret" not in error["message"]


async def test_unexpected_exception_mid_stream_is_an_internal_error_event(
    http: httpx.AsyncClient, client: ScriptedClient
) -> None:
    client.script(HELLO_WORLD, error=RuntimeError("secret internal detail"), error_after=1)
    events = sse_events(await http.post("/v1/chat/completions", json=chat_body(stream=True)))
    assert events[-1]["error"]["type"] == "internal_error"
    assert "secret" not in events[-1]["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_generation_without_finish_reason_is_an_internal_error(
    http: httpx.AsyncClient, client: ScriptedClient, stream: bool
) -> None:
    client.script([wire.GenerationOutput("partial")])
    response = await http.post("/v1/completions", json=completion_body(stream=stream))
    if stream:
        assert sse_events(response)[-1]["error"]["type"] == "internal_error"
    else:
        assert_error(response, 500, "internal_error")


# Refused requests ---------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"{not json", b'{"model": "test-model",', b"\xff\xfe", b""])
async def test_invalid_json_is_a_400(http: httpx.AsyncClient, client: ScriptedClient, content: bytes) -> None:
    response = await http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    error = assert_error(response, 400, "invalid_request_error")
    assert "JSON" in error["message"]
    assert client.requests == []


@pytest.mark.parametrize("body", [[], ["model"], "chat", 42, None])
async def test_body_that_is_not_an_object_is_a_400(http: httpx.AsyncClient, body: Any) -> None:
    response = await http.post("/v1/completions", content=json.dumps(body).encode())
    error = assert_error(response, 400, "invalid_request_error")
    assert "JSON object" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": USER}, "model"),
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", chat_body(messages=[]), "messages"),
        ("/v1/chat/completions", chat_body(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
        ("/v1/chat/completions", chat_body(temperature=2.5), "temperature"),
        ("/v1/chat/completions", chat_body(top_p=0), "top_p"),
        ("/v1/chat/completions", chat_body(top_k=-2), "top_k"),
        ("/v1/chat/completions", chat_body(max_tokens=0), "max_tokens"),
        ("/v1/chat/completions", chat_body(max_completion_tokens=0), "max_completion_tokens"),
        ("/v1/chat/completions", chat_body(seed=2**64), "seed"),
        ("/v1/chat/completions", chat_body(seed=-1), "seed"),
        ("/v1/chat/completions", chat_body(presence_penalty=3), "presence_penalty"),
        ("/v1/chat/completions", chat_body(stop=[str(i) for i in range(17)]), "stop"),
        ("/v1/chat/completions", chat_body(stream="yes please"), "stream"),
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", completion_body(prompt=["one", "two"]), "prompt"),
        ("/v1/completions", completion_body(frequency_penalty=-2.5), "frequency_penalty"),
        ("/v1/chat/completions", chat_body(max_tokens=4_294_967_301), "max_tokens"),
        ("/v1/chat/completions", chat_body(top_k=2**32 + 1), "top_k"),
        ("/v1/completions", completion_body(max_tokens=2**64), "max_tokens"),
        ("/v1/chat/completions", chat_body(stop=5), "stop"),
        ("/v1/chat/completions", chat_body(tools=[tool(f"f{i}") for i in range(129)]), "tools"),
        ("/v1/chat/completions", chat_body(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
    ],
)
async def test_validation_error_is_a_400_naming_the_field(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, body: dict[str, Any], param: str
) -> None:
    assert_error(await http.post(path, json=body), 400, "invalid_request_error", param=param)
    assert client.requests == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_is_a_404(http: httpx.AsyncClient, client: ScriptedClient, path: str, stream: bool) -> None:
    body = {**(chat_body() if "chat" in path else completion_body()), "model": "gpt-4o", "stream": stream}
    error = assert_error(
        await http.post(path, json=body), 404, "invalid_request_error", code="model_not_found", param="model"
    )
    assert "gpt-4o" in error["message"]
    assert client.requests == []


async def test_models_endpoints(http: httpx.AsyncClient) -> None:
    listing = (await http.get("/v1/models")).json()
    assert listing["object"] == "list"
    assert [card["id"] for card in listing["data"]] == [MODEL]
    card = (await http.get(f"/v1/models/{MODEL}")).json()
    assert (card["id"], card["object"]) == (MODEL, "model")
    assert_error(await http.get("/v1/models/gpt-4o"), 404, "invalid_request_error", code="model_not_found")


async def test_health_and_ready(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    assert (await http.get("/health")).json() == {"status": "ok"}
    assert (await http.get("/ready")).status_code == 200
    client.ready = False
    assert (await http.get("/ready")).status_code == 503
    assert (await http.get("/health")).status_code == 200


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/nope"), ("POST", "/v1/engines/x/completions"), ("GET", "/")])
async def test_unknown_route_is_an_openai_style_404(http: httpx.AsyncClient, method: str, path: str) -> None:
    error = assert_error(await http.request(method, path), 404, "invalid_request_error")
    assert path in error["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/chat/completions"), ("PUT", "/v1/completions"), ("POST", "/v1/models"), ("DELETE", "/health")],
)
async def test_wrong_method_is_a_405(http: httpx.AsyncClient, method: str, path: str) -> None:
    error = assert_error(await http.request(method, path), 405, "invalid_request_error")
    assert method in error["message"]


async def test_body_over_the_limit_is_a_413(client: ScriptedClient) -> None:
    async with http_client(scripted_app(client, max_body_bytes=300)) as http:
        small = chat_body()
        assert len(json.dumps(small)) < 300
        assert (await http.post("/v1/chat/completions", json=small)).status_code == 200
        large = chat_body(messages=[{"role": "user", "content": "x" * 400}])
        assert_error(await http.post("/v1/chat/completions", json=large), 413, "invalid_request_error")

        # Without a Content-Length (chunked upload) the limit holds too.
        async def chunks() -> AsyncIterator[bytes]:
            data = json.dumps(large).encode()
            for start in range(0, len(data), 64):
                yield data[start : start + 64]

        response = await http.post("/v1/chat/completions", content=chunks())
        assert "content-length" not in response.request.headers
        assert_error(response, 413, "invalid_request_error")
        assert len(client.requests) == 1


UNSUPPORTED = [
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
]


@pytest.mark.parametrize(("path", "fields", "param"), UNSUPPORTED)
@pytest.mark.parametrize("stream", [False, True])
async def test_unsupported_parameter_is_refused_not_ignored(
    *, http: httpx.AsyncClient, client: ScriptedClient, path: str, fields: dict[str, Any], param: str, stream: bool
) -> None:
    body = {**(chat_body() if "chat" in path else completion_body()), **fields, "stream": stream}
    error = assert_error(
        await http.post(path, json=body), 400, "invalid_request_error", code="unsupported_parameter", param=param
    )
    assert "not supported" in error["message"]
    assert client.requests == []


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"n": 1, "response_format": {"type": "text"}, "logprobs": False, "tools": []}),
        ("/v1/completions", {"n": 1, "echo": False, "best_of": 1, "suffix": ""}),
    ],
)
async def test_unsupported_parameters_at_their_neutral_values_are_accepted(
    http: httpx.AsyncClient, client: ScriptedClient, path: str, fields: dict[str, Any]
) -> None:
    body = {**(chat_body() if "chat" in path else completion_body()), **fields}
    assert (await http.post(path, json=body)).status_code == 200
    assert len(client.requests) == 1


async def test_requests_still_succeed_after_every_kind_of_error(client: ScriptedClient) -> None:
    async with http_client(scripted_app(client, max_body_bytes=1000), raise_app_exceptions=False) as http:
        statuses = []
        statuses.append((await http.post("/v1/chat/completions", content=b"{oops")).status_code)
        statuses.append((await http.post("/v1/chat/completions", json=[1])).status_code)
        statuses.append((await http.post("/v1/chat/completions", json=chat_body(temperature=9))).status_code)
        statuses.append((await http.post("/v1/chat/completions", json=chat_body(model="nope"))).status_code)
        statuses.append((await http.get("/v1/nowhere")).status_code)
        statuses.append((await http.get("/v1/completions")).status_code)
        statuses.append((await http.post("/v1/completions", json=completion_body(prompt="x" * 2000))).status_code)
        statuses.append((await http.post("/v1/completions", json=completion_body(best_of=2))).status_code)
        client.script(HELLO_WORLD, error=ServiceUnavailableError("down"), error_after=0)
        statuses.append((await http.post("/v1/chat/completions", json=chat_body())).status_code)
        client.script(HELLO_WORLD, error=RuntimeError("boom"), error_after=0)
        statuses.append((await http.post("/v1/chat/completions", json=chat_body())).status_code)
        client.script(HELLO_WORLD, error=InvalidRequestError("bad"), error_after=1)
        sse_events(await http.post("/v1/chat/completions", json=chat_body(stream=True)))
        assert statuses == [400, 400, 400, 404, 404, 405, 413, 400, 503, 500]

        client.script(HELLO_WORLD)
        ok = await http.post("/v1/chat/completions", json=chat_body())
        assert ok.status_code == 200
        assert ok.json()["choices"][0]["message"]["content"] == "Hello world"
        events = sse_events(await http.post("/v1/completions", json=completion_body(stream=True)))
        assert "".join(event["choices"][0]["text"] for event in events) == "Hello world"


# Through the official openai SDK ------------------------------------------------------------


async def test_sdk_chat_completion(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    completion = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_completion_tokens=4, seed=7, stop=["\n"]
    )
    assert isinstance(completion, SdkChatCompletion)
    assert completion.model == MODEL
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "Hello world"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (7, 2, 9)
    assert (client.requests[0].max_tokens, client.requests[0].seed, client.requests[0].stop) == (4, 7, ("\n",))


async def test_sdk_chat_completion_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(chunk, SdkChatCompletionChunk) for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == "Hello world"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 9


async def test_sdk_completion(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    completion = await sdk.completions.create(model=MODEL, prompt="Once upon a time")
    assert isinstance(completion, SdkCompletion)
    assert completion.choices[0].text == "Hello world"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 9
    assert client.requests[0].prompt == "Once upon a time"


async def test_sdk_completion_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.completions.create(model=MODEL, prompt="Once upon a time", stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(chunk, SdkCompletion) for chunk in chunks)
    assert "".join(chunk.choices[0].text for chunk in chunks) == "Hello world"
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_sdk_models(sdk: openai.AsyncOpenAI) -> None:
    assert [model.id async for model in sdk.models.list()] == [MODEL]
    assert (await sdk.models.retrieve(MODEL)).id == MODEL


async def test_sdk_sees_unsupported_parameter_as_bad_request(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.completions.create(model=MODEL, prompt="x", best_of=2)
    assert caught.value.status_code == 400
    assert caught.value.code == "unsupported_parameter"
    assert caught.value.param == "best_of"
    assert client.requests == []


async def test_sdk_sees_unknown_model_as_not_found(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.completions.create(model="gpt-4o", prompt="x")
    assert caught.value.code == "model_not_found"


async def test_sdk_sees_unavailable_backend_as_503(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(HELLO_WORLD, error=ServiceUnavailableError("Triton is unavailable"), error_after=0)
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True)
    assert caught.value.status_code == 503


async def test_a_503_says_when_to_retry(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(HELLO_WORLD, error=ServiceUnavailableError("the request queue is full"), error_after=0)
    response = await http.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "queue is full" in response.json()["error"]["message"]


async def test_sdk_raises_on_an_error_event_mid_stream(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(HELLO_WORLD, error=ServiceUnavailableError("Triton went away"), error_after=1)
    stream = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True)
    received: list[str] = []
    with pytest.raises(openai.APIError, match="Triton went away"):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "Hello"
