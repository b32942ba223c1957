"""API keys, the limit on concurrent requests and client disconnects, in front of the proxy's routes."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from launcher import cli
from llgtriton import wire
from llgtriton.settings import Settings, SettingsError, to_toml
from tests.proxy.scripted import MODEL, ScriptedClient, assert_error, chat_body, http_client, scripted_app

SECRET = "sk-test-0123456789abcdef"
CHAT = "/v1/chat/completions"


async def test_with_a_key_configured_v1_routes_need_it(client: ScriptedClient) -> None:
    async with http_client(scripted_app(client, api_key=SECRET)) as http:
        missing = await http.post(CHAT, json=chat_body())
        assert_error(missing, 401, "invalid_request_error", code="invalid_api_key")
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = await http.get("/v1/models", headers={"Authorization": f"Bearer {SECRET}x"})
        assert_error(wrong, 401, "invalid_request_error", code="invalid_api_key")
        basic = await http.get("/v1/models", headers={"Authorization": f"Basic {SECRET}"})
        assert basic.status_code == 401
        good = await http.post(CHAT, json=chat_body(), headers={"Authorization": f"Bearer {SECRET}"})
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "Hello world"
        # Probes stay open.
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/ready")).status_code == 200
    assert len(client.requests) == 1  # refused requests never reached Triton


async def test_the_sdk_with_the_right_and_a_wrong_key(client: ScriptedClient) -> None:
    for key, works in ((SECRET, True), ("sk-wrong", False)):
        async with openai.AsyncOpenAI(
            base_url="http://test/v1",
            api_key=key,
            max_retries=0,
            http_client=http_client(scripted_app(client, api_key=SECRET)),  # type: ignore[arg-type]
        ) as sdk:
            call = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            if works:
                assert (await call).choices[0].message.content == "Hello world"
            else:
                with pytest.raises(openai.AuthenticationError):
                    await call


async def test_keys_from_a_file_rotate_and_are_never_logged(
    client: ScriptedClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# current and next key\n{SECRET}\n\nsk-next-key\n")
    caplog.set_level(logging.DEBUG)
    async with http_client(scripted_app(client, api_key_file=key_file)) as http:
        for key in (SECRET, "sk-next-key"):
            response = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert response.status_code == 200
        assert (await http.get("/v1/models", headers={"Authorization": "Bearer # current"})).status_code == 401
    assert SECRET not in caplog.text and "sk-next-key" not in caplog.text


def test_an_unreadable_or_empty_key_file_stops_the_proxy_from_starting(client: ScriptedClient, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read the API key file"):
        scripted_app(client, api_key_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(SettingsError, match="holds no key"):
        scripted_app(client, api_key_file=tmp_path / "empty")
    # The command line refuses it before starting anything.
    assert cli.main(["proxy", f"--proxy-api-key-file={tmp_path / 'empty'}"]) == 2


def test_print_config_never_shows_the_key() -> None:
    text = to_toml(Settings.model_validate({"proxy": {"api_key": SECRET}}))
    assert SECRET not in text
    assert '# api_key = "<hidden>"' in text
    assert SECRET not in repr(Settings.model_validate({"proxy": {"api_key": SECRET}}))


class GatedClient(ScriptedClient):
    """Holds every generation at a gate until the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        self.started.set()
        await self.gate.wait()
        async for output in super().generate(request, request_id):
            yield output


async def test_over_the_concurrency_limit_is_a_429_with_retry_after() -> None:
    client = GatedClient()
    async with http_client(scripted_app(client, max_concurrent_requests=1)) as http:
        first = asyncio.create_task(http.post(CHAT, json=chat_body(stream=True)))
        await asyncio.wait_for(client.started.wait(), 5)
        refused = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert_error(refused, 429, "rate_limit_exceeded", code="rate_limit_exceeded")
        assert refused.headers["retry-after"] == "1"
        assert (await http.get("/v1/models")).status_code == 200  # only generations count
        client.gate.set()
        streamed = await first
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
        again = await http.post(CHAT, json=chat_body())  # the slot is free once the stream has ended
        assert again.status_code == 200
    assert len(client.requests) == 2  # the refused one never reached Triton


@pytest.mark.parametrize("stream", [False, True])
async def test_each_of_n_choices_holds_a_slot(stream: bool) -> None:
    client = GatedClient()
    client.gate.set()
    async with http_client(scripted_app(client, max_concurrent_requests=2)) as http:
        refused = await http.post(CHAT, json=chat_body(n=3, stream=stream))
        assert_error(refused, 429, "rate_limit_exceeded", code="rate_limit_exceeded")
        assert client.requests == []
        assert (await http.post(CHAT, json=chat_body(n=2, stream=stream))).status_code == 200
        assert (await http.post(CHAT, json=chat_body(stream=stream))).status_code == 200  # the slots are free again


async def test_a_background_response_holds_a_slot_until_it_ends(tmp_path: Path) -> None:
    client = GatedClient()
    app = scripted_app(client, max_concurrent_requests=2, responses_store=tmp_path / "store.sqlite3")
    async with http_client(app) as http:
        for _ in range(2):
            created = await http.post("/v1/responses", json={"model": MODEL, "input": "x", "background": True})
            assert created.status_code == 200
        refused = await http.post("/v1/responses", json={"model": MODEL, "input": "x", "background": True})
        assert_error(refused, 429, "rate_limit_exceeded", code="rate_limit_exceeded")
        assert_error(await http.post(CHAT, json=chat_body()), 429, "rate_limit_exceeded", code="rate_limit_exceeded")
        client.gate.set()
        for _ in range(100):  # the background generations finish on the next loop iterations
            response = await http.post(CHAT, json=chat_body())
            if response.status_code != 429:
                break
            await asyncio.sleep(0.02)
        assert response.status_code == 200


async def test_a_client_that_disconnects_frees_its_slot() -> None:
    client = GatedClient()
    app = scripted_app(client, max_concurrent_requests=1)
    async with http_client(app) as http:
        first = asyncio.create_task(http.post(CHAT, json=chat_body(stream=True)))
        await asyncio.wait_for(client.started.wait(), 5)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        client.gate.set()
        for _ in range(50):  # the cancelled request unwinds on the next loop iterations
            response = await http.post(CHAT, json=chat_body())
            if response.status_code != 429:
                break
            await asyncio.sleep(0.01)
        assert response.status_code == 200


async def test_without_settings_there_is_neither_key_nor_limit(http: httpx.AsyncClient) -> None:
    responses = await asyncio.gather(*(http.post(CHAT, json=chat_body()) for _ in range(20)))
    assert {response.status_code for response in responses} == {200}


class CancellableClient(GatedClient):
    """Records that the generation it serves was cancelled (its stream closed by the proxy)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = asyncio.Event()

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        try:
            async for output in super().generate(request, request_id):
                yield output
        finally:
            self.closed.set()


def _chat_scope(content_length: int) -> dict[str, Any]:
    """The ASGI scope of a JSON POST to the chat route, for driving the app message by message."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT,
        "raw_path": CHAT.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(content_length).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }


def _client_that_hangs_up(body: bytes) -> tuple[Callable[[], Awaitable[dict[str, Any]]], asyncio.Event]:
    """An ASGI ``receive`` that delivers ``body``, then the disconnect once the event is set."""
    hung_up = asyncio.Event()
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await hung_up.wait()
        return {"type": "http.disconnect"}

    return receive, hung_up


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_hangs_up_while_queued_cancels_its_generation(stream: bool) -> None:
    client = CancellableClient()
    app = scripted_app(client)
    body = json.dumps(chat_body(stream=stream)).encode()
    receive, hung_up = _client_that_hangs_up(body)

    async def send(message: MutableMapping[str, Any]) -> None:
        pass

    scope = _chat_scope(content_length=len(body))
    call = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(client.started.wait(), 5)  # waiting for its first output, as when queued
    hung_up.set()
    await asyncio.wait_for(client.closed.wait(), 5)  # the generation was cancelled, not left running
    await asyncio.wait_for(call, 5)
    assert not client.gate.is_set()


@pytest.mark.parametrize("events", [1, 2, 3, 4, 5, 6])
async def test_a_server_that_cuts_a_stream_of_several_choices_short_gets_its_own_cancellation(events: int) -> None:
    """Found by schemathesis, whose ASGI transport cuts event streams with an anyio cancel scope (as
    servers and middleware built on anyio do): with n > 1, the cancellation used to leave the app as
    a CancelledError the scope could not recognise as its own, so it escaped the scope."""
    app = scripted_app(ScriptedClient())
    body = json.dumps(chat_body(stream=True, n=2)).encode()
    receive, hung_up = _client_that_hangs_up(body)
    sent = 0
    with anyio.CancelScope() as server:

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal sent
            if message["type"] == "http.response.body" and not server.cancel_called:
                sent += 1
                if sent == events:
                    hung_up.set()
                    server.cancel()

        await app(_chat_scope(content_length=len(body)), receive, send)
    # Here, not a CancelledError: the scope took back its cancellation, or the app had already
    # ended the stream it saw cut (the disconnect that came with it).
    assert server.cancel_called and sent == events


async def test_a_client_that_hangs_up_while_sending_its_body_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """Found by bench/proxy_overhead.py: this used to end in an unhandled exception and a traceback."""
    client = CancellableClient()
    app = scripted_app(client)
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"model": ', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = _chat_scope(content_length=400)
    await asyncio.wait_for(app(scope, receive, send), 5)
    assert not client.started.is_set()
    assert sent[0]["status"] == 499
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)


class StallingClient(CancellableClient):
    """Sends one output, then holds the generation open until it is cancelled."""

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        self.started.set()
        try:
            yield wire.GenerationOutput("Hel", None, 3, 1)
            await asyncio.Event().wait()
        finally:
            self.closed.set()


async def test_a_client_that_hangs_up_mid_stream_cancels_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    client = StallingClient()
    app = scripted_app(client)
    body = json.dumps(chat_body(stream=True)).encode()
    receive, hung_up = _client_that_hangs_up(body)
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)
        if b"Hel" in message.get("body", b""):
            hung_up.set()  # the client read the first words and left

    await asyncio.wait_for(app(_chat_scope(content_length=len(body)), receive, send), 5)
    assert client.closed.is_set()
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert not any(b"[DONE]" in message.get("body", b"") for message in sent)  # nobody is reading
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)


async def test_a_cancellation_that_is_not_a_hang_up_passes_through() -> None:
    """The server stopping cancels request tasks; that must stay a cancellation, not become a 499."""
    client = StallingClient()
    app = scripted_app(client)
    body = json.dumps(chat_body(stream=False)).encode()
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    call = asyncio.create_task(app(_chat_scope(content_length=len(body)), receive, send))
    await asyncio.wait_for(client.started.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert client.closed.is_set()
    assert sent == []
