"""Fixtures of the end-to-end tests against the session's real server."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from bench.harness import RunningServer


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    """The official OpenAI SDK, pointed at the server."""
    with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0) as client:
        yield client  # (closed after the module, not whenever the garbage collector gets to it)
