"""Load and cancellation through the real path: abandoned requests must not keep the server busy.

vLLM's cancellation scenario: 200 requests whose clients give up after 0.5 s, then a new request
must complete within 5 s. Here the new one completes that fast only if the backend freed every
abandoned request's slot and queue place.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.abandon import ABANDONED, abandon_requests
from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"


def _in_flight(server: RunningServer) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.proxy_port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "llgtriton_proxy_requests_in_flight":
                return float(sample.value)
    raise AssertionError("no in-flight gauge in /metrics")


def test_two_hundred_abandoned_requests_then_a_new_one_within_5_s(server: RunningServer, loaded_model: Any) -> None:
    # Every request runs to max_tokens: a story that ended early with EOS would not be abandoned.
    no_end = {str(token): -100 for token in loaded_model.eos_token_ids}

    abandoned = asyncio.run(abandon_requests(server.openai_base_url, MODEL, logit_bias=no_end))
    assert abandoned >= ABANDONED - 2  # (a request may finish within 0.5 s)

    started = time.monotonic()
    with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=30) as client:
        response = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=5, temperature=0
        )
    elapsed = time.monotonic() - started
    assert response.choices[0].finish_reason in {"stop", "length"}
    assert elapsed < 5, f"the new request took {elapsed:.1f} s: abandoned work was still running"

    deadline = time.monotonic() + 10
    while _in_flight(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _in_flight(server) == 0


def test_a_request_beyond_the_context_is_a_400_with_the_numbers(server: RunningServer) -> None:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1_000_000
            )
        message = str(caught.value)
        assert "the context is 8192 tokens" in message and "1000000 to generate" in message
        # The server goes on serving.
        response = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
        )
    assert response.choices[0].finish_reason in {"stop", "length"}
