"""What the proxy adds on top of Triton, with an engine so fast that the layers above it dominate.

Starts ``llgtriton serve --engine-engine synthetic``: the real tritonserver and python backend,
whose engine loads no model and streams ``--max-tokens`` tokens to every running request a step,
as fast as it can send them. At each concurrency (closed loop: that many clients, each sending its
next request when the previous one ends) the same streaming requests go, alternately:

- ``direct``: straight to Triton over gRPC with ``tritonclient.grpc.aio`` (the proxy's own client,
  with the shared wire codec);
- ``proxy``: through the OpenAI API, with a client that counts SSE events: by default the
  near-free one of ``bench.raw_http`` (``--client httpx``: a lean ``httpx`` client), so the load
  generator's own cost does not land on the proxy's side.

Reported per layer: requests/s, chunks/s, tokens/s, the gap between a request's chunks p50, latency
per request (send to last chunk) p50/p99 and time to first chunk p50; then what the proxy adds: p50
latency per request and per chunk, and its share of direct throughput.

    .venv/bin/python -m bench.proxy_overhead --concurrency 1 16 64 256 --seconds 10
    # on the GPU machine's 16 cores: eight stubs so Triton outruns one proxy process, and two of those
    python -m bench.proxy_overhead --instances 8 --proxy-workers 2 --concurrency 1 16 64 256 --seconds 6
    # the layers' ceiling as the server runs (issue 50): two stubs sharing the engine's core process
    python -m bench.proxy_overhead --instances 2 --proxy-workers 4 --core-process on --concurrency 1 256 \\
        [--step-ms 4] [--no-coalesce]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.layers import quiet_logging, running_server
from bench.raw_http import RawSsePool
from llgtriton import wire
from proxy.errors import ProxyError
from proxy.triton_client import TritonGenerationClient

logger = logging.getLogger("bench.proxy_overhead")
PROMPT = "Count the tokens."


@dataclass
class Trace:
    started: float = field(default_factory=time.perf_counter)
    chunks: list[float] = field(default_factory=list)

    def chunk(self) -> None:
        self.chunks.append(time.perf_counter() - self.started)


Send = Callable[[int], Awaitable[Trace]]


async def via_triton(client: TritonGenerationClient, max_tokens: int, index: int) -> Trace:
    request = wire.GenerationRequest(prompt=PROMPT, max_tokens=max_tokens, stream=True)
    trace = Trace()
    async for output in client.generate(request, f"direct-{index}"):
        if output.text:
            trace.chunk()
    return trace


async def via_proxy(client: httpx.AsyncClient, model: str, max_tokens: int, index: int) -> Trace:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    trace = Trace()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line:  # a chunk with text
                trace.chunk()
    return trace


async def via_proxy_raw(pool: RawSsePool, request: bytes, index: int) -> Trace:
    trace = Trace()

    def on_chunk(data: bytes) -> None:
        if data.startswith(b"data: {") and b'"text":""' not in data:  # a chunk with text
            trace.chunk()

    await pool.stream(request, on_chunk)
    return trace


async def closed_loop(send: Send, concurrency: int, seconds: float, tokens: int) -> dict[str, float]:
    traces: list[Trace] = []
    failures: list[str] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(1 << 62))

    async def client() -> None:
        while time.perf_counter() < deadline:
            try:
                traces.append(await send(next(counter)))
            except (httpx.HTTPError, OSError, EOFError, ProxyError) as exc:  # counted and reported, not fatal
                failures.append(type(exc).__name__)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies = sorted(trace.chunks[-1] for trace in traces if trace.chunks)
    gaps = [later - earlier for trace in traces for earlier, later in itertools.pairwise(trace.chunks)]
    if failures:
        logger.warning("%d requests failed: %s", len(failures), sorted(set(failures)))
    return {
        "requests": len(traces),
        "failed": len(failures),
        "requests_per_s": len(traces) / elapsed,
        "chunks_per_s": sum(len(trace.chunks) for trace in traces) / elapsed,
        "chunks_per_request": statistics.mean(len(trace.chunks) for trace in traces),
        "tokens_per_s": len(traces) * tokens / elapsed,  # every request ends with all its tokens
        "chunk_gap_ms_p50": statistics.median(gaps) * 1e3 if gaps else 0.0,
        "latency_ms_p50": statistics.median(latencies) * 1e3,
        "latency_ms_p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "first_chunk_ms_p50": statistics.median(trace.chunks[0] for trace in traces if trace.chunks) * 1e3,
    }


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def added(direct: dict[str, float], proxy: dict[str, float]) -> dict[str, float]:
    per_request = proxy["latency_ms_p50"] - direct["latency_ms_p50"]
    return {
        "added_ms_per_request_p50": per_request,
        "added_ms_per_chunk": per_request / proxy["chunks_per_request"],
        "proxy_share_of_direct_throughput": proxy["chunks_per_s"] / direct["chunks_per_s"],
    }


def proxy_client(base_url: str) -> httpx.AsyncClient:
    """A fresh HTTP client (connection pool) per timed run: uvicorn closes connections idle for 5 s,
    and a pool kept across the other layer's run would reuse closed ones."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=600)


async def run(arguments: argparse.Namespace, proxy_port: int, grpc_port: int) -> dict[str, Any]:
    triton = TritonGenerationClient(f"127.0.0.1:{grpc_port}", "llm", timeout_s=600)
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    async with proxy_client(proxy_url) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]

    async def timed(name: str, concurrency: int, seconds: float) -> dict[str, float]:
        if name == "direct":
            return await closed_loop(
                lambda i: via_triton(triton, arguments.max_tokens, i), concurrency, seconds, arguments.max_tokens
            )
        if arguments.client == "raw":
            pool = RawSsePool("127.0.0.1", proxy_port)  # fresh connections per timed run, as below
            body = {"model": model, "prompt": PROMPT, "max_tokens": arguments.max_tokens, "stream": True}
            request = pool.request("/v1/completions", body)
            try:
                return await closed_loop(
                    lambda i: via_proxy_raw(pool, request, i), concurrency, seconds, arguments.max_tokens
                )
            finally:
                pool.close()
        async with proxy_client(proxy_url) as http:
            return await closed_loop(
                lambda i: via_proxy(http, model, arguments.max_tokens, i), concurrency, seconds, arguments.max_tokens
            )

    layers = ("direct", "proxy")
    results: dict[str, Any] = {}
    try:
        for name in layers:  # warm both paths, untimed
            await timed(name, 4, 1.0)
        for concurrency in arguments.concurrency:
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in layers}
            for round_index in range(arguments.rounds):  # alternate the order round by round
                for name in layers if round_index % 2 == 0 else reversed(layers):
                    rounds[name].append(await timed(name, concurrency, arguments.seconds))
            figures = {
                name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in rounds.items()
            }
            figures["proxy_adds"] = added(figures["direct"], figures["proxy"])
            results[str(concurrency)] = figures
            logger.info("concurrency %d: %s", concurrency, json.dumps(figures))
    finally:
        await triton.close()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=10.0, help="per layer, concurrency and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per concurrency, alternating the order")
    parser.add_argument(
        "--max-tokens", type=int, default=64, help="tokens per request (a joined response carries several)"
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="Triton model instances (python stubs): one stub sends ~3,000 responses/s, so more make the proxy "
        "the bottleneck",
    )
    parser.add_argument(
        "--proxy-workers",
        type=int,
        default=1,
        help="proxy processes sharing the port (llgtriton --proxy-workers): one forwards 8,000-10,000 chunks/s",
    )
    parser.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="the proxy's client: raw (bench.raw_http, next to no cost) or httpx (the OpenAI SDK's)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=256,
        help="requests the synthetic engine streams at once, a token to each per step (the rest wait)",
    )
    parser.add_argument(
        "--core-process",
        choices=["auto", "on", "off"],
        default="auto",
        help="the synthetic engine in a process of its own, shared by the stubs, as the server runs the "
        "GPU engine (auto: in each stub)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="the synthetic engine's least time a step (--engine-synthetic-step-ms; 0: the layers' ceiling)",
    )
    parser.add_argument(
        "--no-coalesce",
        action="store_true",
        help="one response per token (--no-engine-coalesce-responses), to see what joining a request's "
        "pending tokens does",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/results/proxy_overhead.json"))
    arguments = parser.parse_args(argv)
    quiet_logging()
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    flags = [
        "--engine-engine=synthetic",
        f"--triton-instances={arguments.instances}",
        f"--proxy-workers={arguments.proxy_workers}",
        f"--engine-max-batch-size={arguments.max_batch_size}",
        f"--engine-core-process={arguments.core_process}",
        f"--engine-synthetic-step-ms={arguments.step_ms}",
        "--no-engine-coalesce-responses" if arguments.no_coalesce else "--engine-coalesce-responses",
    ]
    with running_server(arguments.out.parent, "proxy_overhead", *flags) as server:
        results = asyncio.run(run(arguments, server.proxy_port, server.grpc_port))
    command = " ".join(["python -m bench.proxy_overhead", *(sys.argv[1:] if argv is None else argv)])
    payload = {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "client": arguments.client,
        "triton_instances": arguments.instances,
        "proxy_workers": arguments.proxy_workers,
        "max_batch_size": arguments.max_batch_size,
        "core_process": arguments.core_process,
        "coalesce_responses": not arguments.no_coalesce,
        "step_ms": arguments.step_ms,
        "cores": os.cpu_count(),
        "results": results,
    }
    arguments.out.write_text(json.dumps(payload, indent=2) + "\n")
    logger.info("wrote %s", arguments.out)


if __name__ == "__main__":
    main()
