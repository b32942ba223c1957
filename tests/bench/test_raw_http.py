"""The benchmark's near-free HTTP client against the real proxy app served by uvicorn.

Its counts go into docs/benchmarks.md, so it must read a stream the way the OpenAI SDK does: every
event, in order, on a reused connection, and refuse what is not a 200 stream.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn

from bench.raw_http import RawHttpError, RawSsePool
from llgtriton import wire
from tests.proxy.scripted import MODEL, ScriptedClient, scripted_app

WORDS = [f" w{index}" for index in range(40)]


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, uvicorn.Server]]:
    client = ScriptedClient()
    client.script(
        [wire.GenerationOutput(word, None, 3, index + 1) for index, word in enumerate(WORDS[:-1])]
        + [wire.GenerationOutput(WORDS[-1], wire.FinishReason.LENGTH, 3, len(WORDS))]
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(scripted_app(client), host="127.0.0.1", port=port, log_level="warning", http="httptools")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield port, server
    server.should_exit = True
    await asyncio.wait_for(task, 10)


async def test_it_reads_every_event_in_order_on_one_connection(server: tuple[int, uvicorn.Server]) -> None:
    port, _ = server
    pool = RawSsePool("127.0.0.1", port)
    request = pool.request("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 40, "stream": True})
    for _ in range(3):
        chunks: list[bytes] = []
        await pool.stream(request, chunks.append)
        assert chunks[-1] == b"data: [DONE]\n\n"
        texts = [json.loads(chunk.removeprefix(b"data: "))["choices"][0]["text"] for chunk in chunks[:-1]]
        assert texts == [*WORDS, ""]  # every word, then the finish chunk
        assert pool.idle_connections == 1  # kept for the next request
    pool.close()


async def test_a_refused_request_is_an_error_and_the_next_one_works(server: tuple[int, uvicorn.Server]) -> None:
    port, _ = server
    pool = RawSsePool("127.0.0.1", port)
    wrong = pool.request("/v1/completions", {"model": "other", "prompt": "x", "stream": True})
    with pytest.raises(RawHttpError, match="HTTP 404"):
        await pool.stream(wrong, lambda chunk: None)
    right = pool.request("/v1/completions", {"model": MODEL, "prompt": "x", "stream": True})
    chunks: list[bytes] = []
    await pool.stream(right, chunks.append)
    assert chunks[-1] == b"data: [DONE]\n\n"
    pool.close()
