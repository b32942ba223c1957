"""The backend's own metrics on Triton's metrics port: steps, batch rows, constrained rows, mask time, queue."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
NAMES = ("steps", "rows", "constrained_rows", "mask_seconds")


def _backend_metrics(server: RunningServer) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("llgtriton_backend_") and sample.labels.get("model") == "llm":
                values[sample.name.removeprefix("llgtriton_backend_").removesuffix("_total")] = sample.value
    return values


def _chat(server: RunningServer, constrained: bool) -> str:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0) as client:
        response = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a cat as JSON."}],
            max_tokens=24,
            response_format={"type": "json_object"} if constrained else {"type": "text"},
        )
    return response.choices[0].message.content or ""


def test_triton_metrics_count_steps_rows_constrained_rows_and_mask_time(server: RunningServer) -> None:
    before = _backend_metrics(server)
    assert {*NAMES, "queue_depth", "running_requests", "batch_size", "constrained_fraction"} <= set(before)

    with ThreadPoolExecutor(4) as pool:  # two constrained and two free requests share steps
        list(pool.map(lambda constrained: _chat(server, constrained), [True, False, True, False]))

    deadline = time.monotonic() + 10  # published once a second, off the step loop
    after = _backend_metrics(server)
    while after["steps"] == before["steps"] and time.monotonic() < deadline:
        time.sleep(0.2)
        after = _backend_metrics(server)
    grown = {name: after[name] - before[name] for name in NAMES}
    assert grown["steps"] > 0
    assert grown["rows"] >= grown["steps"]  # every step has at least one row
    assert 0 < grown["constrained_rows"] < grown["rows"]  # the free requests' rows are not counted
    assert grown["mask_seconds"] > 0
    assert after["queue_depth"] == 0
