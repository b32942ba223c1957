"""The client suite: popular client libraries, used as their documentation shows, against a live server.

It runs in a venv of its own (``.venv-clients``, pinned by ``requirements/clients.txt``), started by
``tests/e2e/test_clients.py`` with the server's address in the environment. The 135M model cannot be
relied on for useful answers, so the tests assert what the protocol guarantees: shapes, types that
validate, finish reasons, calls that parse.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall

BASE_URL_VARIABLE = "LLGTRITON_CLIENTS_BASE_URL"


@pytest.fixture(scope="session")
def base_url() -> str:
    """The server's OpenAI base URL (``http://host:port/v1``)."""
    url = os.environ.get(BASE_URL_VARIABLE)
    if not url:
        pytest.skip(f"{BASE_URL_VARIABLE} is not set: tests/e2e/test_clients.py runs this suite against a server")
    return url


@pytest.fixture(scope="session")
def model() -> str:
    return os.environ.get("LLGTRITON_CLIENTS_MODEL", "SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    """A folder with the served model's tokenizer (lm-eval counts context tokens with it)."""
    path = os.environ.get("LLGTRITON_CLIENTS_TOKENIZER")
    if not path:
        pytest.skip("LLGTRITON_CLIENTS_TOKENIZER is not set")
    return path


@pytest.fixture(scope="session")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def async_client(base_url: str) -> openai.AsyncOpenAI:
    """A client per test: each test's event loop owns its connections."""
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)


def function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """A message's tool calls, each checked to be a function call (the only kind this server makes)."""
    calls = message.tool_calls or []
    assert all(isinstance(call, ChatCompletionMessageFunctionToolCall) for call in calls)
    return [call for call in calls if isinstance(call, ChatCompletionMessageFunctionToolCall)]
