"""Where the proxy's time to the first streamed chunk goes: timestamps along one request at a time.

Starts ``llgtriton triton --engine-engine synthetic`` and, in a second process, the proxy with two
probes: one outside the whole ASGI app (request arrival, response start, first body sent) and one
around the Triton client (gRPC call, first gRPC response). The client sends ``--requests``
one-token streaming completions one after another with ``httpx`` and stamps its send and the
first ``data:`` line. Every process reads the same monotonic clock (``time.perf_counter`` is
CLOCK_MONOTONIC on Linux), so the stamps compare. For reference, the same requests then go
straight to Triton over gRPC from the client's process.

    .venv/bin/python -m bench.proxy_first_chunk --requests 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.layers import quiet_logging
from bench.raw_http import RawSsePool
from bench.reports import write_report
from llgtriton import wire
from llgtriton.settings import ProxySettings
from proxy.triton_client import TritonGenerationClient
from tests.support.harness import ROOT, free_port, spawn, stop_process, wait_until_ready

logger = logging.getLogger("bench.proxy_first_chunk")
MODEL = "synthetic"
PROMPT = "Count the tokens."
# The segments of the proxy path, in order: (name, from stamp, to stamp).
SEGMENTS = (
    ("client send -> proxy receives the request", "send", "arrive"),
    ("proxy: request -> gRPC call", "arrive", "grpc_call"),
    ("gRPC call -> first gRPC response", "grpc_call", "grpc_first"),
    ("first gRPC response -> HTTP response start", "grpc_first", "start"),
    ("response start -> first body sent", "start", "first_body"),
    ("first body sent -> client reads it", "first_body", "first"),
    ("client send -> client reads the first chunk", "send", "first"),
)
TOTAL = SEGMENTS[-1][0]
WARM_UP = 20


def probed_proxy(port: int, triton_url: str, marks_path: Path) -> None:
    """Serve the proxy with its probes until SIGINT, then write the stamps to ``marks_path``."""
    import uvicorn

    from proxy.app import create_app

    marks: list[dict[str, float]] = []

    class ProbedClient(TritonGenerationClient):
        async def generate(
            self, request: wire.GenerationRequest, request_id: str
        ) -> AsyncGenerator[wire.GenerationOutput]:
            mark = marks[-1]
            mark["grpc_call"] = time.perf_counter()
            async for output in super().generate(request, request_id):
                mark.setdefault("grpc_first", time.perf_counter())
                yield output

    settings = ProxySettings(triton_url=triton_url, served_model_name=MODEL)
    app: Any = None  # made on the server's event loop, which the gRPC client binds to

    async def probed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await app(scope, receive, send)
            return
        mark = {"arrive": time.perf_counter()}
        marks.append(mark)

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                mark["start"] = time.perf_counter()
            elif message["type"] == "http.response.body" and message.get("body"):
                mark.setdefault("first_body", time.perf_counter())
            await send(message)

        await app(scope, receive, stamped)

    async def serve() -> None:
        nonlocal app
        app = create_app(settings, ProbedClient(triton_url, settings.model_name, settings.request_timeout_s))
        # The HTTP stack of `llgtriton serve`.
        config = uvicorn.Config(probed, host="127.0.0.1", port=port, log_level="warning", http="httptools")
        await uvicorn.Server(config).serve()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on
        pass
    finally:
        marks_path.write_text(json.dumps(marks))


BODY = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "stream": True}


def through_proxy(port: int, requests: int) -> list[dict[str, float]]:
    """The requests from ``httpx``, the OpenAI SDK's HTTP client."""
    stamps = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(requests):
            stamp = {"send": time.perf_counter()}
            with client.stream("POST", "/v1/completions", json=BODY) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        stamp.setdefault("first", time.perf_counter())
            stamps.append(stamp)
    return stamps


async def through_proxy_raw(port: int, requests: int) -> list[dict[str, float]]:
    """The same requests from a client that costs next to nothing (``bench.raw_http``)."""
    pool = RawSsePool("127.0.0.1", port)
    request = pool.request("/v1/completions", BODY)
    stamps = []
    try:
        for _ in range(requests):
            stamp = {"send": time.perf_counter()}

            def on_chunk(data: bytes, stamp: dict[str, float] = stamp) -> None:
                if data.startswith(b"data: {"):
                    stamp.setdefault("first", time.perf_counter())

            await pool.stream(request, on_chunk)
            stamps.append(stamp)
    finally:
        pool.close()
    return stamps


async def straight_to_triton(triton_url: str, requests: int) -> list[float]:
    client = TritonGenerationClient(triton_url, "llm", 60)
    request = wire.GenerationRequest(prompt=PROMPT, max_tokens=1, stream=True)
    firsts = []
    try:
        for index in range(requests):
            sent = time.perf_counter()
            first = None
            async for _ in client.generate(request, f"direct-{index}"):
                first = first or time.perf_counter() - sent
            assert first is not None
            firsts.append(first)
    finally:
        await client.close()
    return firsts


def segments(client_stamps: Sequence[dict[str, float]], proxy_marks: Sequence[dict[str, float]]) -> dict[str, float]:
    """Median milliseconds of each segment, over the requests both sides stamped."""
    joined = [{**proxy, **client} for client, proxy in zip(client_stamps, proxy_marks, strict=True)]
    return {name: statistics.median(s[end] - s[begin] for s in joined) * 1e3 for name, begin, end in SEGMENTS}


def measure(arguments: argparse.Namespace) -> dict[str, Any]:
    arguments.out.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port, metrics_port, proxy_port = (free_port() for _ in range(4))
    triton_url = f"127.0.0.1:{grpc_port}"
    log = arguments.out / "proxy_first_chunk_triton.log"
    triton = spawn(
        log,
        [
            "triton",
            "--engine-engine=synthetic",
            f"--triton-http-port={http_port}",
            f"--triton-grpc-port={grpc_port}",
            f"--triton-metrics-port={metrics_port}",
        ],
    )
    marks_path = arguments.out / "proxy_first_chunk_marks.json"
    proxy = None
    try:
        wait_until_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", triton, log)
        command = [sys.executable, "-m", "bench.proxy_first_chunk", "--probe-proxy", str(proxy_port), triton_url]
        proxy = subprocess.Popen([*command, str(marks_path)], cwd=ROOT)
        wait_until_ready(f"http://127.0.0.1:{proxy_port}/ready", proxy)
        # Each client warms up (20 requests, discarded with their marks) and then sends its requests.
        through_proxy(proxy_port, WARM_UP)
        httpx_stamps = through_proxy(proxy_port, arguments.requests)
        asyncio.run(through_proxy_raw(proxy_port, WARM_UP))
        raw_stamps = asyncio.run(through_proxy_raw(proxy_port, arguments.requests))
        direct = asyncio.run(straight_to_triton(triton_url, arguments.requests))
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(30)  # it writes its stamps as it stops
        stop_process(triton)
    marks = json.loads(marks_path.read_text())
    marks_path.unlink()
    log.unlink()
    requests = arguments.requests
    httpx_marks = marks[WARM_UP : WARM_UP + requests]
    raw_marks = marks[2 * WARM_UP + requests : 2 * WARM_UP + 2 * requests]
    straight = statistics.median(direct) * 1e3
    by_client = {"httpx": segments(httpx_stamps, httpx_marks), "raw": segments(raw_stamps, raw_marks)}
    return {
        "requests": requests,
        "date": time.strftime("%Y-%m-%d"),
        "proxy_ms_p50": by_client["httpx"],
        "proxy_ms_p50_raw_client": by_client["raw"],
        "straight_to_triton_first_response_ms_p50": straight,
        "added_first_chunk_ms_p50": {name: figures[TOTAL] - straight for name, figures in by_client.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="one-token streaming requests per path")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="proxy_first_chunk", help="the report is <out>/<name>.json")
    parser.add_argument("--probe-proxy", nargs=3, metavar=("PORT", "TRITON_URL", "MARKS"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.probe_proxy is not None:
        port, triton_url, marks_path = arguments.probe_proxy
        probed_proxy(int(port), triton_url, Path(marks_path))
        return
    quiet_logging()
    report = measure(arguments)
    for name, value in report["proxy_ms_p50"].items():
        logger.info(
            "%-48s %6.2f ms (httpx client)  %6.2f ms (raw client)", name, value, report["proxy_ms_p50_raw_client"][name]
        )
    logger.info(
        "%-48s %6.2f ms", "straight to Triton: first response", report["straight_to_triton_first_response_ms_p50"]
    )
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
