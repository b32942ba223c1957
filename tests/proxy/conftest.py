"""Fixtures of the proxy's tests: the proxy in-process, in front of a scripted generation client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.proxy.scripted import BASE_URL, ScriptedClient, http_client, scripted_app
from tests.support.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a Responses store lives, as several proxies may share it: a SQLite file (in folders that
    do not exist yet), or an empty database of its own on the tests' PostgreSQL."""
    if request.param == "sqlite":
        return tmp_path / "state" / "nested" / "responses.db"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


@pytest.fixture
def client() -> ScriptedClient:
    return ScriptedClient()


@pytest.fixture
async def http(client: ScriptedClient) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(scripted_app(client)) as http:
        yield http


@pytest.fixture
async def sdk(client: ScriptedClient) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{BASE_URL}/v1",
        api_key="x",
        max_retries=0,
        # The SDK annotates httpx2 clients; it accepts (and is tested here with) an httpx one.
        http_client=http_client(scripted_app(client)),  # type: ignore[arg-type]
    ) as sdk_client:
        yield sdk_client
