"""The same requests through the engine, Triton and the proxy, compared in one run.

Starts ``llgtriton serve`` (real tritonserver, python backend, proxy) on free ports, and loads
the same model in this process for the engine layer. At each concurrency (closed loop: that
many clients, each sending its next request when the previous one ends), the same greedy chat
requests, unconstrained and JSON-schema-constrained, go:

- ``engine``: straight to the engine's service (no Triton, no HTTP): in this process, or with
  ``--engine-apart`` in a core process of its own, as the server runs it, so that this process's
  client threads do not share the step loop's GIL;
- ``triton``: through Triton's gRPC streaming API with ``tritonclient.grpc.aio``, as the proxy
  and any Triton client do;
- ``proxy``: through the OpenAI API with the official ``openai`` SDK, streaming;
- ``perf_analyzer`` (with ``--perf-analyzer BINARY``): Triton's own load generator, streaming
  over gRPC at the same concurrency, fed the same requests from an input-data file
  (``bench/perf_analyzer/*.json`` holds the GPU run's; ``--write-perf-analyzer-data DIR`` writes
  them). Its figures come from its profile export: each request's send and response times.
- ``aiperf`` (with ``--aiperf COMMAND``): NVIDIA's load generator against the proxy's chat
  endpoint, streaming, with the same prompts and body (:mod:`bench.aiperf_layer`).

``--layers`` picks which of the first three run. Each layer's entry also holds ``cpu_cores``:
the CPU each of the server's processes used while it ran (:mod:`bench.process_cpu`).

Reported per layer: time to first token and time between tokens (p50 over requests; a
request's TBT is its mean gap between first and last token) and output tokens/s.

    .venv/bin/python -m bench.layers --concurrency 1 4 8 --requests 8 --max-tokens 24
    # on the GPU machine (bench/gpu_layers.sh): random weights of a Llama-3.2-1B shape on CUDA
    python -m bench.layers --random-model device_carry/model --shape llama-3.2-1b --device cuda \
        --perf-analyzer perf_analyzer --concurrency 1 8 32 64 128 --requests 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

from backend.contract import Service
from backend.core_server import STATUS_INTERVAL_S
from backend.entry import start_service
from backend.model_loader import checkpoint_path
from bench import process_cpu
from bench.aiperf_layer import AiperfRun, hub_cache_tokenizer, prompts_file, run_aiperf
from bench.jsonschemabench import SCHEMA
from bench.perf_analyzer_layer import perf_analyzer_data, run_perf_analyzer
from bench.reports import write_report
from bench.step_rate import StepRecorder
from bench.tbt_overhead import random_checkpoint
from llgtriton import wire
from llgtriton.messages import ChatMessage
from llgtriton.settings import EngineSettings
from proxy.triton_client import TritonGenerationClient
from tests.support.harness import RecordingSink, RunningServer, start_server, stop_server

logger = logging.getLogger("bench.layers")
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [f"Describe person number {i} as JSON with a name, an age and a city." for i in range(256)]
# The GPU run's requests, which bench/perf_analyzer/*.json hold for perf_analyzer.
SHIPPED_DATA = {"requests": 256, "max_tokens": 64}


def requests_at(concurrency: int, minimum: int) -> int:
    """Requests per layer and kind at ``concurrency``: every client sends at least two."""
    return max(minimum, 2 * concurrency)


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
        messages=(ChatMessage("user", prompt),),
        max_tokens=max_tokens,
        stream=True,
        temperature=0.0,
        guide_type=wire.GuideType.JSON_SCHEMA if constrained else None,
        guide=json.dumps(SCHEMA) if constrained else None,
    )


async def via_engine(service: Service, request: wire.GenerationRequest, index: int) -> Timing:
    timing = Timing()
    sink = RecordingSink(on_output=timing.observe)
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
Measure = Callable[[int, int, bool], dict[str, float]]  # (concurrency, requests, constrained) -> figures


def layer_requests(count: int, max_tokens: int, constrained: bool) -> list[wire.GenerationRequest]:
    return [generation(prompt, max_tokens, constrained) for prompt in PROMPTS[:count]]


def write_perf_analyzer_data(folder: Path, count: int, max_tokens: int) -> dict[bool, Path]:
    """``free.json`` and ``constrained.json`` in ``folder``; returns them by ``constrained``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for constrained in (False, True):
        path = folder / ("constrained.json" if constrained else "free.json")
        entries = perf_analyzer_data(layer_requests(count, max_tokens, constrained))["data"]
        path.write_text('{"data": [\n' + ",\n".join(json.dumps(entry) for entry in entries) + "\n]}\n")
        paths[constrained] = path
    return paths


async def closed_loop(send: Send, requests: Sequence[wire.GenerationRequest], concurrency: int) -> dict[str, float]:
    """``concurrency`` clients share the requests; the figures over all of them."""
    queue = list(enumerate(requests))
    timings: list[Timing] = []
    failures: list[str] = []

    async def client() -> None:
        while queue:
            index, request = queue.pop(0)
            try:
                timings.append(await send(request, index))
            except Exception as exc:  # counted and reported, never retried behind the figures' back
                failures.append(repr(exc))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    tbts = [t for t in (timing.tbt() for timing in timings) if t is not None]
    if failures:
        logger.warning("%d of %d requests failed, first: %s", len(failures), len(requests), failures[0])
    return {
        "failed": len(failures),
        "ttft_ms_p50": statistics.median(t.arrivals[0] for t in timings if t.arrivals) * 1e3,
        "tbt_ms_p50": statistics.median(tbts) * 1e3,
        "tokens_per_s": sum(t.tokens for t in timings) / elapsed,
        "mean_tokens": statistics.mean(t.tokens for t in timings),
        # Below 1 when the layers merge tokens into one response (the stub's pump falling behind).
        "chunks_per_token": sum(len(t.arrivals) for t in timings) / max(1, sum(t.tokens for t in timings)),
    }


@contextlib.contextmanager
def running_server(out: Path, name: str, *extra: str) -> Iterator[RunningServer]:
    """``llgtriton serve`` as ``make serve`` runs it (plus ``extra`` flags), on free ports, stopped with
    Ctrl-C at the end. Its log goes to ``out/<name>_server.log``, kept only when something fails."""
    log = out / f"{name}_server.log"
    server = start_server(log, *extra)
    try:
        yield server
    finally:
        stop_server(server)
    log.unlink()


def served_model(model: str, random_model: Path | None, shape: str | None, work: Path) -> str:
    """``model``, or a checkpoint of random weights of ``shape`` saved under ``work`` (GPU runs)."""
    if random_model is None:
        return model
    checkpoint = work / "random-checkpoint"
    random_checkpoint(random_model, shape, checkpoint)
    return str(checkpoint)


def engine_settings(
    model: str,
    device: str,
    max_batch_size: int,
    engine: str = "torch",
    *,
    coalesce_responses: bool = True,
    kv_cache: str = "auto",
    max_model_len: int | None = None,
    core_process: str = "auto",
) -> EngineSettings:
    """The engine a benchmark serves: bf16 on CUDA, fp32 on CPU."""
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return EngineSettings.model_validate(
        {
            "engine": engine,
            "model": model,
            "device": device,
            "dtype": dtype,
            "max_batch_size": max_batch_size,
            "coalesce_responses": coalesce_responses,
            "kv_cache": kv_cache,
            "max_model_len": max_model_len,
            "core_process": core_process,
        }
    )


def engine_flags(settings: EngineSettings) -> list[str]:
    """The ``llgtriton serve`` / ``triton`` flags that give Triton's engine ``settings``."""
    return [
        f"--engine-engine={settings.engine}",
        f"--engine-model={settings.model}",
        f"--engine-device={settings.device}",
        f"--engine-dtype={settings.dtype}",
        f"--engine-max-batch-size={settings.max_batch_size}",
        "--engine-coalesce-responses" if settings.coalesce_responses else "--no-engine-coalesce-responses",
        f"--engine-kv-cache={settings.kv_cache}",
        *([f"--engine-max-model-len={settings.max_model_len}"] if settings.max_model_len else []),
        f"--engine-core-process={settings.core_process}",
    ]


def quiet_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def external_layers(
    arguments: argparse.Namespace, settings: EngineSettings, server: RunningServer, model: str
) -> dict[str, Measure]:
    """The load generators that run in processes of their own: perf_analyzer (Triton) and aiperf (proxy)."""
    measures: dict[str, Measure] = {}
    if arguments.perf_analyzer is not None:
        most = requests_at(max(arguments.concurrency), arguments.requests)
        data = write_perf_analyzer_data(arguments.work / "perf_analyzer_data", most, arguments.max_tokens)
        measures["perf_analyzer"] = lambda concurrency, count, constrained: run_perf_analyzer(
            arguments.perf_analyzer,
            data[constrained],
            grpc_port=server.grpc_port,
            concurrency=concurrency,
            count=count,
            work=arguments.work,
        )
    if arguments.aiperf is not None:
        hf_home = arguments.work / "hf"
        aiperf = AiperfRun(
            command=arguments.aiperf,
            url=f"http://127.0.0.1:{server.proxy_port}",
            model=model,
            tokenizer=hub_cache_tokenizer(arguments.random_model or checkpoint_path(settings), hf_home),
            hf_home=hf_home,
            max_tokens=arguments.max_tokens,
        )
        most = requests_at(max(arguments.concurrency), arguments.requests)
        dataset = prompts_file(arguments.work / "aiperf_prompts.jsonl", PROMPTS[:most])
        measures["aiperf"] = lambda concurrency, count, constrained: run_aiperf(
            aiperf,
            dataset,
            concurrency=concurrency,
            count=count,
            schema=SCHEMA if constrained else None,
            work=arguments.work,
        )
    return measures


async def measured(
    figures: Awaitable[dict[str, Any]], cpu: process_cpu.CpuRecorder, steps: StepRecorder
) -> dict[str, Any]:
    """``figures``, with the CPU each of the server's processes used while they were taken (over the
    load generator's own window where it reports one) and how the engine stepped meanwhile."""
    start = time.time()
    result = dict(await figures)
    end = time.time()
    window = result.pop("window_start_s", start), result.pop("window_end_s", end)
    if not start - 1 <= window[0] < window[1] <= end + 1:  # not this clock's times after all
        window = start, end
    stepping = await asyncio.to_thread(steps.between, *window)
    return {**result, "cpu_cores": cpu.cores_between(*window), "engine_steps": stepping}


async def run(
    arguments: argparse.Namespace,
    settings: EngineSettings,
    server: RunningServer,
    progress: Callable[[dict[str, Any]], None] = lambda results: None,
) -> dict[str, Any]:
    # The engine layer's sinks cost nothing to call: no response thread for it, in either mode.
    apart = "on" if arguments.engine_apart else "off"
    service = start_service(settings.model_copy(update={"coalesce_responses": False, "core_process": apart}))
    triton = TritonGenerationClient(f"127.0.0.1:{server.grpc_port}", "llm", timeout_s=600)
    proxy = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.proxy_port}/v1", api_key="unused", max_retries=0)
    model = (await proxy.models.list()).data[0].id
    own: dict[str, Send] = {
        "engine": lambda request, index: via_engine(service, request, index),
        "triton": lambda request, index: via_triton(triton, request, index),
        "proxy": lambda request, index: via_proxy(proxy, model, request, index),
    }
    layers = {name: send for name, send in own.items() if name in arguments.layers}
    external = external_layers(arguments, settings, server, model)
    cpu = process_cpu.CpuRecorder(server.pid)
    cpu.start()
    # A core process apart reports its step totals every STATUS_INTERVAL_S: read them that much later.
    lag = STATUS_INTERVAL_S if arguments.engine_apart else 0.0
    engine_steps = StepRecorder(service.step_counters.totals, lag_s=lag)
    triton_steps = StepRecorder.of_triton(server.metrics_port)
    engine_steps.start()
    triton_steps.start()
    results: dict[str, Any] = {}
    try:
        for concurrency in arguments.concurrency:
            for constrained in (False, True):
                count = requests_at(concurrency, arguments.requests)
                requests = layer_requests(count, arguments.max_tokens, constrained)
                key = f"{concurrency}/{'constrained' if constrained else 'free'}"
                # Untimed: the proxy's path once, and each engine (this process's, Triton's) for a
                # round at this batch size. The first steps at a new batch size and length are slow
                # on CUDA, and would count against whichever layer happened to run first.
                await own["proxy"](requests[0], -1)
                await closed_loop(own["engine"], requests[:concurrency], concurrency)
                await closed_loop(own["triton"], requests[:concurrency], concurrency)
                names = list(layers)
                shift = len(results) % max(len(names), 1)  # rotate the order, so no layer always runs first
                results[key] = {
                    name: await measured(
                        closed_loop(layers[name], requests, concurrency),
                        cpu,
                        engine_steps if name == "engine" else triton_steps,
                    )
                    for name in names[shift:] + names[:shift]
                }
                for name, measure in external.items():
                    try:
                        results[key][name] = await measured(
                            asyncio.to_thread(measure, concurrency, count, constrained), cpu, triton_steps
                        )
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the report says so; the rest stands
                        logger.error("%s at %s: %s", name, key, exc)
                        results[key][name] = {"error": str(exc)}
                logger.info("%s: %s", key, json.dumps(results[key]))
                progress(results)  # a run cut short keeps what it measured
    finally:
        cpu.stop()
        engine_steps.stop()
        triton_steps.stop()
        service.shutdown()
        await triton.close()
        await proxy.close()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument(
        "--requests", type=int, default=8, help="requests per layer, concurrency and kind (at least 2 per client)"
    )
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--device", default="cpu", help="torch device of the engine (in this process and in Triton)")
    parser.add_argument("--random-model", type=Path, help="config + tokenizer folder: serve random weights")
    parser.add_argument("--shape", help="with --random-model: layer sizes of a public model (bench.tbt_overhead)")
    parser.add_argument("--max-batch-size", type=int, default=128, help="the engine's running sequences")
    parser.add_argument(
        "--layers",
        nargs="+",
        choices=["engine", "triton", "proxy"],
        default=["engine", "triton", "proxy"],
        help="the layers driven by this process's clients",
    )
    parser.add_argument("--perf-analyzer", help="perf_analyzer binary: add it as a layer (Triton, gRPC streaming)")
    parser.add_argument("--aiperf", help="how to start aiperf, e.g. 'aiperf': add it as a layer (the proxy's chat API)")
    parser.add_argument(
        "--no-coalesce-responses",
        dest="coalesce_responses",
        action="store_false",
        help="one response per token, sent by the engine's thread (the engine's --no-engine-coalesce-responses)",
    )
    parser.add_argument("--kv-cache", choices=["auto", "slots", "growing"], default="auto", help="the engine's")
    parser.add_argument(
        "--max-model-len", type=int, default=2048, help="the engine's context (sizes a preallocated KV cache)"
    )
    parser.add_argument(
        "--core-process", choices=["auto", "on", "off"], default="auto", help="Triton's engine in a process of its own"
    )
    parser.add_argument(
        "--engine-apart",
        action="store_true",
        help="the engine layer's engine in a process of its own (else in this process, beside its clients)",
    )
    parser.add_argument("--proxy-workers", type=int, default=1, help="the proxy's processes")
    parser.add_argument(
        "--triton-instances", type=int, default=1, help="python backend stubs (sharing one engine process)"
    )
    parser.add_argument("--write-perf-analyzer-data", type=Path, metavar="DIR", help="write the input files, exit")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="layers_cpu", help="the report is <out>/<name>.json")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/llgtriton-layers"),
        help="the random checkpoint and the load generators' own files",
    )
    arguments = parser.parse_args(argv)
    quiet_logging()
    if arguments.write_perf_analyzer_data is not None:
        write_perf_analyzer_data(arguments.write_perf_analyzer_data, arguments.requests, arguments.max_tokens)
        return
    arguments.out.mkdir(parents=True, exist_ok=True)
    arguments.work.mkdir(parents=True, exist_ok=True)
    model = served_model("embedded", arguments.random_model, arguments.shape, arguments.work)
    settings = engine_settings(
        model,
        arguments.device,
        arguments.max_batch_size,
        coalesce_responses=arguments.coalesce_responses,
        kv_cache=arguments.kv_cache,
        max_model_len=arguments.max_model_len,
        core_process=arguments.core_process,
    )

    def report(results: dict[str, Any]) -> None:
        write_report(
            arguments.out / f"{arguments.name}.json",
            {
                "machine": arguments.device,
                "model": f"random weights, shape {arguments.shape}" if arguments.random_model else model,
                "tokenizer": str(arguments.random_model) if arguments.random_model else model,
                "max_tokens": arguments.max_tokens,
                "requests": arguments.requests,
                "coalesce_responses": arguments.coalesce_responses,
                "kv_cache": arguments.kv_cache,
                "max_model_len": arguments.max_model_len,
                "core_process": arguments.core_process,
                "engine_apart": arguments.engine_apart,
                "proxy_workers": arguments.proxy_workers,
                "triton_instances": arguments.triton_instances,
                "date": time.strftime("%Y-%m-%d"),
                "results": results,
            },
        )

    flags = [
        *engine_flags(settings),
        f"--proxy-workers={arguments.proxy_workers}",
        f"--triton-instances={arguments.triton_instances}",
    ]
    with running_server(arguments.out, "layers", *flags) as server:
        report(asyncio.run(run(arguments, settings, server, report)))


if __name__ == "__main__":
    main()
