"""Fixtures of the end-to-end tests against the session's real server."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.harness import ROOT, RunningServer, start_server, stop_server

HERMES_TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "hermes.jinja"


@pytest.fixture(scope="session")
def hermes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A second server: SmolLM2 with a Hermes-style chat template, whose tools section writes calls
    in <tool_call> tags (tests/fixtures/chat_templates/hermes.jinja)."""
    running = start_server(tmp_path_factory.mktemp("hermes") / "serve.log", f"--engine-chat-template={HERMES_TEMPLATE}")
    yield running
    stop_server(running)
    assert "tool calls: hermes format, detected from the chat template" in running.log.read_text()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    """The official OpenAI SDK, pointed at the server."""
    with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0) as client:
        yield client  # (closed after the module, not whenever the garbage collector gets to it)
