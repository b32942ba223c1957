"""Prometheus metrics of the proxy, served at ``/metrics``.

- ``llgtriton_proxy_requests_total{route,status}``: finished HTTP requests by status code;
- ``llgtriton_proxy_requests_in_flight``: generation requests being served now;
- ``llgtriton_proxy_request_duration_seconds{route}``: request start to last byte;
- ``llgtriton_proxy_time_to_first_token_seconds``: generation sent to Triton until its first
  output came back;
- ``llgtriton_proxy_time_between_tokens_seconds``: gaps between a generation's outputs
  (streamed deltas; a stream output carries one detokenized piece, usually one token);
- ``llgtriton_proxy_replica_requests_in_flight{replica}`` and
  ``llgtriton_proxy_replica_retries_total{replica}``: with several Triton replicas, the
  generations each serves now, and those it refused before starting that went to another.

Each app has its own registry, so several apps in one process (tests) do not share counts.
With several proxy processes (``--proxy-workers``), prometheus_client's multiprocess mode keeps
every process's values in files under ``PROMETHEUS_MULTIPROC_DIR``, and ``/metrics``, whichever
process answers it, sums them: counters and histograms over every process that ever ran, the
in-flight gauges over the live ones.
Routes outside the API are counted as ``other`` to keep the label set bounded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llgtriton import wire
from proxy.guards import GENERATION_PATHS
from proxy.triton_client import GenerationClient

ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready", "/metrics"})
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5)


class ProxyMetrics:
    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        """``multiprocess_dir``: serve the sums over every proxy process that writes there.

        prometheus_client decides at import whether values live in those files, from the
        ``PROMETHEUS_MULTIPROC_DIR`` environment variable; the worker sets it first.
        """
        self.registry = CollectorRegistry()
        self._exported = self.registry
        if multiprocess_dir is not None:
            self._exported = CollectorRegistry()
            MultiProcessCollector(self._exported, path=str(multiprocess_dir))  # type: ignore[no-untyped-call]
        self.requests = Counter(
            "llgtriton_proxy_requests", "Finished HTTP requests.", ["route", "status"], registry=self.registry
        )
        self.in_flight = Gauge(
            "llgtriton_proxy_requests_in_flight",
            "Generation requests being served.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.duration = Histogram(
            "llgtriton_proxy_request_duration_seconds",
            "Request start to last byte.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_token = Histogram(
            "llgtriton_proxy_time_to_first_token_seconds",
            "Generation sent to Triton until its first output.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.between_tokens = Histogram(
            "llgtriton_proxy_time_between_tokens_seconds",
            "Gaps between a generation's outputs.",
            buckets=_GAP_BUCKETS,
            registry=self.registry,
        )
        self.replica_in_flight = Gauge(
            "llgtriton_proxy_replica_requests_in_flight",
            "Generations in flight per Triton replica.",
            ["replica"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.replica_retries = Counter(
            "llgtriton_proxy_replica_retries",
            "Generations a replica refused before starting them, retried on another replica.",
            ["replica"],
            registry=self.registry,
        )

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self._exported), media_type=CONTENT_TYPE_LATEST)


class MeteredClient:
    """A GenerationClient that times the outputs of the client it wraps."""

    def __init__(self, client: GenerationClient, metrics: ProxyMetrics) -> None:
        self._client = client
        self._metrics = metrics

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        last = time.perf_counter()
        first = True
        async with aclosing(self._client.generate(request, request_id)) as outputs:
            async for output in outputs:
                now = time.perf_counter()
                (self._metrics.first_token if first else self._metrics.between_tokens).observe(now - last)
                first, last = False, now
                yield output

    async def is_ready(self) -> bool:
        return await self._client.is_ready()

    async def close(self) -> None:
        await self._client.close()


class RequestMetrics:
    """ASGI middleware: counts every HTTP request by route and status, and times it."""

    def __init__(self, app: ASGIApp, metrics: ProxyMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        generation = route in GENERATION_PATHS
        status = 500  # if the app fails before it answers
        started = time.perf_counter()

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if generation:
            self._metrics.in_flight.inc()
        try:
            await self._app(scope, receive, send_and_watch)
        finally:
            if generation:
                self._metrics.in_flight.dec()
            self._metrics.requests.labels(route, str(status)).inc()
            self._metrics.duration.labels(route).observe(time.perf_counter() - started)
