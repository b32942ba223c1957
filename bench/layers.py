"""The same requests through the engine, Triton and the proxy, compared in one run.

Starts ``llgtriton serve`` (real tritonserver, python backend, proxy) on free ports, and loads
the same model in this process for the engine layer. At each concurrency (closed loop: that
many clients, each sending its next request when the previous one ends), the same greedy chat
requests, unconstrained and JSON-schema-constrained, go:

- ``engine``: straight to :class:`GenerationService` in this process (no Triton, no HTTP);
- ``triton``: through Triton's gRPC streaming API with ``tritonclient.grpc.aio``, as the proxy
  and any Triton client do;
- ``proxy``: through the OpenAI API with the official ``openai`` SDK, streaming.

Reported per layer: time to first token and time between tokens (p50 over requests; a
request's TBT is its mean gap between first and last token) and output tokens/s.

    .venv/bin/python -m bench.layers --concurrency 1 4 8 --requests 8 --max-tokens 24
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

from backend.service import GenerationService
from llgtriton import wire
from llgtriton.settings import EngineSettings
from proxy.triton_client import TritonGenerationClient

logger = logging.getLogger("bench.layers")
ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PROMPTS = [f"Describe person number {i} as JSON with a name, an age and a city." for i in range(64)]


@dataclass
class Timing:
    """One request's token arrival times (seconds since it was sent) and its completion tokens."""

    started: float = field(default_factory=time.perf_counter)
    arrivals: list[float] = field(default_factory=list)
    tokens: int = 0

    def arrived(self) -> None:
        self.arrivals.append(time.perf_counter() - self.started)

    def observe(self, output: wire.GenerationOutput) -> None:
        """One output of the engine or Triton: text arrived, and the tokens so far."""
        if output.text:
            self.arrived()
        self.tokens = output.completion_tokens

    def tbt(self) -> float | None:
        if self.tokens < 2 or not self.arrivals:
            return None
        return (self.arrivals[-1] - self.arrivals[0]) / (self.tokens - 1)


def generation(prompt: str, max_tokens: int, constrained: bool) -> wire.GenerationRequest:
    return wire.GenerationRequest(
        messages=(wire.ChatMessage("user", prompt),),
        max_tokens=max_tokens,
        stream=True,
        temperature=0.0,
        guide_type=wire.GuideType.JSON_SCHEMA if constrained else None,
        guide=json.dumps(SCHEMA) if constrained else None,
    )


class EngineSink:
    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.done = threading.Event()
        self.error: Exception | None = None

    def send(self, output: wire.GenerationOutput, *, final: bool) -> None:
        self.timing.observe(output)
        if final:
            self.done.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()

    def is_cancelled(self) -> bool:
        return False


async def via_engine(service: GenerationService, request: wire.GenerationRequest, index: int) -> Timing:
    timing = Timing()
    sink = EngineSink(timing)
    service.submit(request, f"engine-{index}", sink)
    await asyncio.to_thread(sink.done.wait)
    if sink.error is not None:
        raise RuntimeError(f"engine request failed: {sink.error}")
    return timing


async def via_triton(client: TritonGenerationClient, request: wire.GenerationRequest, index: int) -> Timing:
    timing = Timing()
    async for output in client.generate(request, f"triton-{index}"):
        timing.observe(output)
    return timing


async def via_proxy(client: openai.AsyncOpenAI, model: str, request: wire.GenerationRequest, index: int) -> Timing:
    assert request.messages is not None
    params: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": f"proxy-{index}",
    }
    if request.guide is not None:
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": json.loads(request.guide), "strict": True},
        }
    timing = Timing()
    stream: openai.AsyncStream[ChatCompletionChunk] = await client.chat.completions.create(**params)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            timing.arrived()
        if chunk.usage is not None:
            timing.tokens = chunk.usage.completion_tokens
    return timing


Send = Callable[[wire.GenerationRequest, int], Awaitable[Timing]]


async def closed_loop(send: Send, requests: Sequence[wire.GenerationRequest], concurrency: int) -> dict[str, float]:
    """``concurrency`` clients share the requests; the figures over all of them."""
    queue = list(enumerate(requests))
    timings: list[Timing] = []

    async def client() -> None:
        while queue:
            index, request = queue.pop(0)
            timings.append(await send(request, index))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    tbts = [t for t in (timing.tbt() for timing in timings) if t is not None]
    return {
        "ttft_ms_p50": statistics.median(t.arrivals[0] for t in timings if t.arrivals) * 1e3,
        "tbt_ms_p50": statistics.median(tbts) * 1e3,
        "tokens_per_s": sum(t.tokens for t in timings) / elapsed,
        "mean_tokens": statistics.mean(t.tokens for t in timings),
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Server:
    pid: int
    proxy_port: int
    grpc_port: int


READY_TIMEOUT_S = 600.0


def start_llgtriton(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m llgtriton.cli <argv>`` in its own session, its output in ``log``."""
    with log.open("wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "llgtriton.cli", *argv],
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )


def wait_until_ready(url: str, what: str, process: subprocess.Popen[bytes]) -> None:
    """Until ``url`` answers 200; fails when ``process`` exits first or after ``READY_TIMEOUT_S``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not become ready in {READY_TIMEOUT_S:.0f} s")


def stop_llgtriton(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a user would; SIGKILL to its session after 60 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_server(out: Path, name: str, *extra: str) -> Iterator[Server]:
    """``llgtriton serve`` as ``make serve`` runs it (plus ``extra`` flags), on free ports, stopped with
    Ctrl-C at the end.

    Its log goes to ``out/<name>_server.log``, which is kept only when something fails.
    """
    log = out / f"{name}_server.log"
    proxy_port, http_port, grpc_port, metrics_port = (_free_port() for _ in range(4))
    argv = [
        "serve",
        f"--proxy-port={proxy_port}",
        f"--proxy-triton-url=127.0.0.1:{grpc_port}",
        f"--triton-http-port={http_port}",
        f"--triton-grpc-port={grpc_port}",
        f"--triton-metrics-port={metrics_port}",
        *extra,
    ]
    process = start_llgtriton(argv, log)
    try:
        try:
            wait_until_ready(f"http://127.0.0.1:{proxy_port}/ready", "llgtriton serve", process)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {log}") from None
        yield Server(process.pid, proxy_port, grpc_port)
    finally:
        stop_llgtriton(process)
    log.unlink()


def quiet_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def run(arguments: argparse.Namespace, proxy_port: int, grpc_port: int) -> dict[str, Any]:
    service = GenerationService.start(EngineSettings())
    triton = TritonGenerationClient(f"127.0.0.1:{grpc_port}", "llm", timeout_s=600)
    proxy = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="unused")
    model = (await proxy.models.list()).data[0].id
    layers: dict[str, Send] = {
        "engine": lambda request, index: via_engine(service, request, index),
        "triton": lambda request, index: via_triton(triton, request, index),
        "proxy": lambda request, index: via_proxy(proxy, model, request, index),
    }
    results: dict[str, Any] = {}
    try:
        for concurrency in arguments.concurrency:
            for constrained in (False, True):
                requests = [generation(p, arguments.max_tokens, constrained) for p in PROMPTS[: arguments.requests]]
                key = f"{concurrency}/{'constrained' if constrained else 'free'}"
                for send in layers.values():  # warm each layer's path once, untimed
                    await send(requests[0], -1)
                names = list(layers)
                shift = len(results) % len(names)  # rotate the order, so no layer always runs first
                results[key] = {
                    name: await closed_loop(layers[name], requests, concurrency)
                    for name in names[shift:] + names[:shift]
                }
                logger.info("%s: %s", key, json.dumps(results[key]))
    finally:
        service.shutdown()
        await triton.close()
        await proxy.close()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests", type=int, default=8, help="requests per layer, concurrency and kind")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    arguments = parser.parse_args(argv)
    quiet_logging()
    arguments.out.mkdir(parents=True, exist_ok=True)
    with running_server(arguments.out, "layers") as server:
        results = asyncio.run(run(arguments, server.proxy_port, server.grpc_port))
    report = {"machine": "cpu", "max_tokens": arguments.max_tokens, "requests": arguments.requests, "results": results}
    path = arguments.out / "layers_cpu.json"
    path.write_text(json.dumps(report, indent=2))
    logger.info("report: %s", path)


if __name__ == "__main__":
    main()
