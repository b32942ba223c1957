"""The proxy in-process, in front of a scripted generation client, and helpers for its requests and responses."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from llgtriton import wire
from llgtriton.settings import ProxySettings
from proxy.app import create_app

MODEL = "test-model"
BASE_URL = "http://test"
HELLO_WORLD = (
    wire.GenerationOutput(text="Hello", prompt_tokens=7, completion_tokens=1),
    wire.GenerationOutput(text=" world", finish_reason=wire.FinishReason.STOP, prompt_tokens=7, completion_tokens=2),
)
USER = [{"role": "user", "content": "Say hello"}]


class ScriptedClient:
    """A GenerationClient that replays ``outputs``, optionally raising ``error`` after ``error_after`` of them."""

    def __init__(self) -> None:
        self.outputs: Sequence[wire.GenerationOutput] = HELLO_WORLD
        self.error: Exception | None = None
        self.error_after = 0
        self.ready = True
        self.requests: list[wire.GenerationRequest] = []
        self.request_ids: list[str] = []

    def script(
        self, outputs: Sequence[wire.GenerationOutput] = (), error: Exception | None = None, error_after: int = 0
    ) -> None:
        self.outputs, self.error, self.error_after = outputs, error, error_after

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        self.requests.append(request)
        self.request_ids.append(request_id)
        for index, scripted in enumerate(self.outputs):
            output = scripted
            if self.error is not None and index == self.error_after:
                raise self.error
            await asyncio.sleep(0)
            if index == 0 and request.prompt_logprobs and output.prompt_logprobs is None:
                # as the backend does: the prompt's scored tokens come with the first output when asked
                count = len(request.prompt_token_ids or ()) or 1
                scored = tuple(wire.TokenLogprob(b"t", -1.0) for _ in range(count - 1))
                output = dataclasses.replace(output, prompt_logprobs=wire.PromptLogprobs(b"t", scored))
            yield output
        if self.error is not None and self.error_after >= len(self.outputs):
            raise self.error

    async def is_ready(self) -> bool:
        return self.ready

    async def close(self) -> None:
        pass


def scripted_app(client: ScriptedClient, **proxy_settings: Any) -> Starlette:
    return create_app(ProxySettings(served_model_name=MODEL, **proxy_settings), client)


def http_client(app: Starlette, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url=BASE_URL)


@contextlib.asynccontextmanager
async def served(app: Starlette) -> AsyncIterator[str]:
    """``app`` behind uvicorn on a free port, in this event loop; its base URL. Unlike the in-process
    transport, which hands over a body once it is whole, a client reads a stream here as it is written."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, **fields}


def completion_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


def sse_events(response: httpx.Response) -> list[Any]:
    """The SSE events of a response: every event is one ``data: <json>`` line, the last ``[DONE]``."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.text
    assert body.endswith("\n\n")
    frames = body.split("\n\n")[:-1]
    for frame in frames:
        assert frame.startswith("data: "), frame
        assert "\n" not in frame, frame
    assert frames[-1] == "data: [DONE]"
    assert frames.count("data: [DONE]") == 1
    return [json.loads(frame.removeprefix("data: ")) for frame in frames[:-1]]


def assert_error(response: httpx.Response, status: int, error_type: str, **expected: Any) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["type"] == error_type
    for key, value in expected.items():
        assert error[key] == value, (key, error)
    return error
