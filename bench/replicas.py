"""Several Triton replicas behind one proxy: throughput against one replica, spread, and failover.

Starts one ``llgtriton triton`` per entry of ``--gpus`` (``CUDA_VISIBLE_DEVICES`` set to it, so two
entries on a two-GPU machine are two GPUs; the same id twice is two instances on one GPU), and two
proxies in front of them: one routed to every replica, one to the first replica only. Then, in
one run, with the official ``openai`` SDK (streaming, half the requests JSON-schema constrained):

1. the same closed-loop workload through the one-replica proxy and through the all-replica proxy:
   output tokens/s, errors, and constrained outputs that fail their schema (must be 0); then
   through the all-replica proxy with ``--concurrency`` clients per replica (the same load on each
   replica as the one-replica run: the scale-out figure);
2. how the all-replica run spread over the replicas (each Triton's own request counter);
3. failover: the same workload again, and the last replica (its supervisor and tritonserver) is
   killed once a third of the requests have ended; requests that had not started on it go to the others, requests it was
   streaming fail with an error (never silently truncated), and every request sent after the
   kill succeeds.

    # on the GPU machine (bench/gpu_replicas.sh): two GPUs, random weights of a Llama-3.2-1B shape
    python -m bench.replicas --random-model device_carry/model --shape llama-3.2-1b --device cuda --gpus 0 1
    # here, on CPU, with the synthetic engine
    .venv/bin/python -m bench.replicas --engine synthetic --gpus 0 0 --requests 64 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import openai

from bench.jsonschemabench import SCHEMA
from bench.layers import PROMPTS, engine_flags, engine_settings, quiet_logging, served_model
from launcher.triton_server import live_children
from tests.support.harness import ROOT, free_port, spawn, stop_process, wait_until_ready

logger = logging.getLogger("bench.replicas")
SUCCESS_COUNTER = re.compile(r'^nv_inference_request_success\{model="llm",version="1"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class Replica:
    gpu: str
    grpc_port: int
    http_port: int
    metrics_port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def served(self) -> float:
        """Requests this Triton has completed successfully (its own metric)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            match = SUCCESS_COUNTER.search(response.read().decode())
        return float(match.group(1)) if match else 0.0

    def kill(self) -> None:
        """SIGKILL the supervisor (so nothing restarts it), then tritonserver and its python stub."""
        servers = live_children(self.process.pid, "tritonserver")
        os.killpg(self.process.pid, signal.SIGKILL)
        for server in servers:
            os.killpg(server, signal.SIGKILL)
        self.process.wait()


@contextlib.contextmanager
def replicas(gpus: Sequence[str], flags: Sequence[str], out: Path, work: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for index, gpu in enumerate(gpus):
            grpc_port, http_port, metrics_port = (free_port() for _ in range(3))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
            argv = [
                "triton",
                f"--triton-grpc-port={grpc_port}",
                f"--triton-http-port={http_port}",
                f"--triton-metrics-port={metrics_port}",
                f"--engine-cache-dir={work / f'cache{index}'}",
                *flags,
            ]
            process = spawn(out / f"triton{index}.log", argv, env)
            started.append(Replica(gpu, grpc_port, http_port, metrics_port, process))
        for index, replica in enumerate(started):
            ready = f"http://127.0.0.1:{replica.http_port}/v2/models/llm/ready"
            wait_until_ready(ready, replica.process, out / f"triton{index}.log")
        yield started
    finally:
        for replica in started:
            stop_process(replica.process)


@contextlib.contextmanager
def proxy(urls: Sequence[str], model_name: str, out: Path, name: str) -> Iterator[int]:
    port = free_port()
    argv = [
        "proxy",
        f"--proxy-port={port}",
        f"--proxy-triton-url={','.join(urls)}",
        f"--proxy-served-model-name={model_name}",
    ]
    process = spawn(out / f"{name}.log", argv)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/ready", process, out / f"{name}.log")
        yield port
    finally:
        stop_process(process)


@dataclass
class Outcome:
    tokens: int = 0
    ok: bool = False
    error: str | None = None
    invalid: bool = False
    sent_at: float = 0.0


async def _one(client: openai.AsyncOpenAI, model: str, index: int, max_tokens: int) -> Outcome:
    constrained = index % 2 == 0
    params: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if constrained:
        params["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    outcome = Outcome(sent_at=time.perf_counter())
    text, finish = [], None
    try:
        stream = await client.chat.completions.create(**params)
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                outcome.tokens = chunk.usage.completion_tokens
    except openai.APIError as exc:
        outcome.error = f"{type(exc).__name__}: {str(exc)[:120]}"
        return outcome
    outcome.ok = True
    if constrained and finish == "stop":  # a request cut by max_tokens is valid only as a prefix
        try:
            jsonschema.validate(json.loads("".join(text)), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            outcome.invalid = True
    return outcome


async def workload(
    port: int, model: str, requests: int, concurrency: int, max_tokens: int, *, outcomes: list[Outcome] | None = None
) -> tuple[list[Outcome], float]:
    """``concurrency`` clients share ``requests`` (closed loop); ``outcomes`` fills as they end."""
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    queue = list(range(requests))
    outcomes = [] if outcomes is None else outcomes

    async def worker() -> None:
        while queue:
            outcomes.append(await _one(client, model, queue.pop(0), max_tokens))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await client.close()
    return outcomes, elapsed


def summary(outcomes: Sequence[Outcome], elapsed: float) -> dict[str, Any]:
    return {
        "requests": len(outcomes),
        "completed": sum(o.ok for o in outcomes),
        "errors": dict(Counter(o.error.split(":")[0] for o in outcomes if o.error)),
        "invalid_constrained": sum(o.invalid for o in outcomes),
        "output_tokens": sum(o.tokens for o in outcomes),
        "seconds": round(elapsed, 2),
        "tokens_per_s": round(sum(o.tokens for o in outcomes) / elapsed, 1),
    }


async def failover(port: int, model: str, victim: Replica, arguments: argparse.Namespace) -> dict[str, Any]:
    """Kill ``victim`` once a third of the requests have ended, with ``concurrency`` still in flight."""
    outcomes: list[Outcome] = []

    async def kill_partway() -> float:
        while len(outcomes) < arguments.requests // 3:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(victim.kill)
        logger.info("killed the replica on GPU %s (%s)", victim.gpu, victim.url)
        return time.perf_counter()

    killer = asyncio.create_task(kill_partway())
    _, elapsed = await workload(
        port, model, arguments.requests, arguments.concurrency, arguments.max_tokens, outcomes=outcomes
    )
    killed_at = await killer
    after = [o for o in outcomes if o.sent_at > killed_at]
    return {
        **summary(outcomes, elapsed),
        "sent_after_kill": len(after),
        "failed_after_kill": sum(not o.ok for o in after),
    }


def _gpu_memory_mib() -> list[int] | None:
    """Memory used on each GPU (nvidia-smi), to show which GPUs the replicas landed on."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    return [int(line) for line in subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()]


async def measure(arguments: argparse.Namespace, replicas_: list[Replica]) -> dict[str, Any]:
    model = arguments.model_name
    results: dict[str, Any] = {}
    with proxy([replicas_[0].url], model, arguments.out, "proxy_one") as port:
        await workload(port, model, arguments.concurrency, arguments.concurrency, 8)  # warm-up
        results["one_replica"] = summary(
            *await workload(port, model, arguments.requests, arguments.concurrency, arguments.max_tokens)
        )
    with proxy([r.url for r in replicas_], model, arguments.out, "proxy_all") as port:
        await workload(port, model, arguments.concurrency, arguments.concurrency, 8)
        before = [r.served() for r in replicas_]
        results["all_replicas"] = summary(
            *await workload(port, model, arguments.requests, arguments.concurrency, arguments.max_tokens)
        )
        results["served_per_replica"] = [int(r.served() - b) for r, b in zip(replicas_, before, strict=True)]
        scale = len(replicas_)
        results["all_replicas_same_load_per_replica"] = summary(
            *await workload(
                port, model, arguments.requests * scale, arguments.concurrency * scale, arguments.max_tokens
            )
        )
        if len(replicas_) > 1:
            results["failover"] = await failover(port, model, replicas_[-1], arguments)
    one = results["one_replica"]["tokens_per_s"]
    results["speedup_same_clients"] = round(results["all_replicas"]["tokens_per_s"] / one, 2)
    results["speedup_same_load_per_replica"] = round(
        results["all_replicas_same_load_per_replica"]["tokens_per_s"] / one, 2
    )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", nargs="+", default=["0", "1"], help="CUDA_VISIBLE_DEVICES of each replica")
    parser.add_argument("--engine", default="torch", choices=["torch", "synthetic"])
    parser.add_argument("--device", default="cpu", help="--engine-device of each replica")
    parser.add_argument("--model", default="embedded", help="--engine-model of each replica")
    parser.add_argument("--random-model", type=Path, help="config + tokenizer folder: serve random weights")
    parser.add_argument("--shape", help="with --random-model: layer sizes of a public model (bench.tbt_overhead)")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results", help="results and logs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llgtriton-replicas"), help="checkpoint, caches")
    arguments = parser.parse_args(argv)
    quiet_logging()
    arguments.out.mkdir(parents=True, exist_ok=True)

    model = served_model(arguments.model, arguments.random_model, arguments.shape, arguments.work)
    flags = engine_flags(engine_settings(model, arguments.device, arguments.max_batch_size, arguments.engine))
    arguments.model_name = "llm-replicas"
    with replicas(arguments.gpus, flags, arguments.out, arguments.work) as started:
        gpu_memory = _gpu_memory_mib()
        results = asyncio.run(measure(arguments, started))
    results["gpu_memory_used_mib_with_replicas_loaded"] = gpu_memory
    results["setup"] = {
        "gpus": arguments.gpus,
        "engine": arguments.engine,
        "model": f"random weights, shape {arguments.shape}" if arguments.random_model else arguments.model,
        "requests": arguments.requests,
        "concurrency": arguments.concurrency,
        "max_tokens": arguments.max_tokens,
        "date": time.strftime("%Y-%m-%d"),
    }
    (arguments.out / "replicas.json").write_text(json.dumps(results, indent=2) + "\n")
    logger.info("%s", json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
