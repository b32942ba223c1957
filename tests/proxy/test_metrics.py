"""The proxy's Prometheus metrics at /metrics, after requests a user would make."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy.scripted import ScriptedClient, chat_body, http_client, scripted_app


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _metrics(http: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return _samples(response.text)


async def test_requests_errors_and_latencies_are_counted(client: ScriptedClient) -> None:
    async with http_client(scripted_app(client)) as http:
        assert (await http.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert (await http.post("/v1/chat/completions", json=chat_body(stream=True))).status_code == 200
        assert (await http.post("/v1/chat/completions", json=chat_body(model="nope"))).status_code == 404
        assert (await http.post("/v1/chat/completions", content=b"{")).status_code == 400
        assert (await http.get("/no/such/route")).status_code == 404
        samples = await _metrics(http)
    chat = "/v1/chat/completions"
    assert samples[("llgtriton_proxy_requests_total", (("route", chat), ("status", "200")))] == 2
    assert samples[("llgtriton_proxy_requests_total", (("route", chat), ("status", "404")))] == 1
    assert samples[("llgtriton_proxy_requests_total", (("route", chat), ("status", "400")))] == 1
    assert samples[("llgtriton_proxy_requests_total", (("route", "other"), ("status", "404")))] == 1
    assert samples[("llgtriton_proxy_requests_in_flight", ())] == 0
    assert samples[("llgtriton_proxy_request_duration_seconds_count", (("route", chat),))] == 4
    # Two generations reached the backend, each with two outputs: two first tokens, two gaps.
    assert samples[("llgtriton_proxy_time_to_first_token_seconds_count", ())] == 2
    assert samples[("llgtriton_proxy_time_between_tokens_seconds_count", ())] == 2


async def test_refused_requests_are_counted_and_metrics_need_no_key(client: ScriptedClient) -> None:
    async with http_client(scripted_app(client, api_key="sk-secret")) as http:
        assert (await http.get("/v1/models")).status_code == 401
        samples = await _metrics(http)
    assert samples[("llgtriton_proxy_requests_total", (("route", "/v1/models"), ("status", "401")))] == 1
    assert "sk-secret" not in str(samples)


async def test_each_app_counts_only_its_own_requests(client: ScriptedClient) -> None:
    async with http_client(scripted_app(client)) as first, http_client(scripted_app(client)) as second:
        await first.get("/v1/models")
        samples = await _metrics(second)
    assert ("llgtriton_proxy_requests_total", (("route", "/v1/models"), ("status", "200"))) not in samples
