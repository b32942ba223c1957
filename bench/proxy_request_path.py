"""The proxy's own time from a request's arrival to its gRPC call, with the translation on the event
loop or on a thread, side by side in one process.

The proxy's app (``create_app``: the middleware, body parsing and validation, the translation into
a ``wire.GenerationRequest``) serves in-process requests from ``httpx``'s ASGI transport; its
Triton client only stamps when it is called and answers one token at once. Each round runs both
variants, alternating their order, each with one-token streaming completions and chat completions
without a constraint:

- ``loop``: as the proxy runs (``proxy.translate.translates_quickly`` decides: a request that
  compiles nothing is translated on the event loop);
- ``thread``: every translation on a thread (``asyncio.to_thread``), as before.

    .venv/bin/python -m bench.proxy_request_path --rounds 6 --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import httpx

import proxy.serving
from bench.reports import host_cpu, write_report
from llgtriton import wire
from llgtriton.settings import ProxySettings
from proxy.app import create_app
from proxy.translate import translates_quickly
from proxy.triton_client import TritonGenerationClient

logger = logging.getLogger("bench.proxy_request_path")
MODEL = "synthetic"
BODIES = {
    "/v1/completions": {"model": MODEL, "prompt": "Count the tokens.", "max_tokens": 1, "stream": True},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count the tokens."}],
        "max_tokens": 1,
        "stream": True,
    },
}
WARM_UP = 50


class StampingClient(TritonGenerationClient):
    """Stamps the call on the request's marks and answers one token: no Triton behind it."""

    def __init__(self, marks: list[dict[str, float]]) -> None:
        super().__init__("127.0.0.1:1", MODEL, 60.0)
        self._marks = marks

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        self._marks[-1]["call"] = time.perf_counter()
        yield wire.GenerationOutput("x", wire.FinishReason.LENGTH, prompt_tokens=4, completion_tokens=1)


def _on_a_thread(request: Any) -> bool:
    return False


async def measure(rounds: int, requests: int) -> dict[str, dict[str, list[float]]]:
    """Median milliseconds from arrival to the gRPC call, per path and variant, one figure per round."""
    marks: list[dict[str, float]] = []
    settings = ProxySettings(triton_url="127.0.0.1:1", served_model_name=MODEL)
    app = create_app(settings, StampingClient(marks))

    async def stamped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            marks.append({"arrive": time.perf_counter()})
        await app(scope, receive, send)

    medians: dict[str, dict[str, list[float]]] = {path: {"loop": [], "thread": []} for path in BODIES}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=stamped), base_url="http://proxy") as client:

        async def one(path: str) -> None:
            async with client.stream("POST", path, json=BODIES[path]) as response:
                response.raise_for_status()
                async for _ in response.aiter_lines():
                    pass

        for round_index in range(rounds):
            variants = ["loop", "thread"] if round_index % 2 == 0 else ["thread", "loop"]
            for variant in variants:
                chosen = translates_quickly if variant == "loop" else _on_a_thread
                setattr(proxy.serving, "translates_quickly", chosen)  # noqa: B010 (this process only)
                for path in BODIES:
                    for _ in range(WARM_UP):
                        await one(path)
                    marks.clear()
                    for _ in range(requests):
                        await one(path)
                    gaps = [(mark["call"] - mark["arrive"]) * 1e3 for mark in marks if "call" in mark]
                    medians[path][variant].append(round(statistics.median(gaps), 3))
    setattr(proxy.serving, "translates_quickly", translates_quickly)  # noqa: B010
    return medians


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=500, help="per path, variant and round")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="proxy_request_path")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per request otherwise)
    medians = asyncio.run(measure(arguments.rounds, arguments.requests))
    for path, variants in medians.items():
        logger.info(
            "%s: arrival -> gRPC call, median ms: translated on the loop %.3f, on a thread %.3f",
            path,
            statistics.median(variants["loop"]),
            statistics.median(variants["thread"]),
        )
    write_report(
        arguments.out / f"{arguments.name}.json",
        {"host_cpu": host_cpu(), "requests": arguments.requests, "median_ms_per_round": medians},
    )


if __name__ == "__main__":
    main()
