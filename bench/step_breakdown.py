"""Where a constrained step's time goes, at large batches: the engine alone, closed-loop clients.

The real step loop (``Scheduler``) and the real logits post-processor run in this process, as in
the engine core. ``--clients`` closed-loop clients each send requests of ``--max-tokens`` tokens
until ``--requests-per-client`` each are done, so requests finish and join at every step as in
serving. Each cell runs free, with one schema shared by every request (``shared``), and with a
schema of its own per request from JSONSchemaBench (``own``, compiled as they arrive: cold), in
alternating order over ``--rounds`` rounds; ``--kinds pressed`` runs the shared schema with every
request asking for its grammar pressure (what reporting it costs), and ``--kinds tools`` a tool the
model must call in its own format (``bench.tool_requests``). A constrained output ends when its JSON
closes, a free one of random weights at ``--max-tokens``: ``free-as-own`` (``-shared``, ``-tools``)
runs free requests cut to the lengths the latest ``own`` cell's outputs had, the like-for-like
baseline for that kind (list it after ``own``). ``--switch-intervals`` runs each
kind under each of Python's thread switch intervals (``sys.setswitchinterval``), alternating too: how
long the mask worker waits for the GIL while the step loop runs Python. ``--hand-off off on`` runs
each kind without and with the step loop waiting for the mask worker to start once it is handed a
step (``worker.start_delay`` is how long the worker waited to start). ``--masks-on worker step-loop``
runs each kind with a step's masks computed on the worker while the tokens are delivered, and on the
step loop's thread (after the next pass is queued, when it is launched ahead); ``default`` leaves it to
the scheduler (``masks_on_loop_rows``). ``--launch-ahead off on`` runs each kind with the next decode
pass queued after its tokens are delivered (as on the CPU) and before (the scheduler's
``launch_ahead``, the server's default on CUDA), so that the device runs it while they are. ``--lanes 1 16`` runs
each kind with a grammar's requests copying one compiled template (sharing its lock in llguidance)
and up to 16, and ``--plain-tokenizer off on`` with every grammar reading forced text through the
Python tokenizer, and with the schemas that never force a special token's spelling on llguidance's
own (the grammar cache's ``lanes`` and ``plain_tokenizer``; it is emptied between such cells).

Per cell it reports tokens/s, TBT and TTFT p50, the step loop's milliseconds per step in each of
its phases (the forward pass lands in whichever phase first waits for the GPU), and the mask
worker's and the post-processor's own parts: consuming the sampled tokens, filling the masks,
checking them, waiting for the worker, filling the masks of rows that joined this step, applying
them; with the mask process, the child's own time consuming the tokens and computing the masks
(``mask_process.compute``). Outputs that end with ``stop`` are checked against their schema with ``jsonschema``.

    python -m bench.step_breakdown --device cuda --random-model /tmp/model_llama --shape llama-3.2-1b \\
        --clients 64 128 256 --rounds 2 --out docs/results --name step_breakdown_h200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import llguidance.hf
import torch

from backend.assembly import torch_engine
from backend.chat_template import ChatTemplate
from backend.constraints import Guidance, GuidanceLogitsProcessor
from backend.grammar_cache import GrammarCache, lanes_for
from backend.guidance_tokenizer import PlainTextTokenizer
from backend.mask_process import MaskProcess
from backend.masking import bitmask_applier
from backend.matcher_table import MatcherTable
from backend.requests import EngineRequest, SamplingParams
from backend.scheduler import MASKS_ON_LOOP_ROWS, Scheduler
from backend.service import GenerationService
from bench.jsonschemabench import DEFAULT_DATA, SCHEMA, load_schemas
from bench.reports import write_report
from bench.tbt_overhead import SHAPES, PhaseTimer, random_model, stats_ms, token_gaps
from bench.tool_requests import ToolCallRequests
from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.messages import ChatMessage
from llgtriton.settings import EngineSettings
from tests.support.harness import RecordingSink

logger = logging.getLogger("bench.step_breakdown")
# pressed: shared, each request asking for grammar_pressure; free-as-X: free, cut to X's lengths
KINDS = ("free", "shared", "own", "pressed", "tools", "free-as-shared", "free-as-own", "free-as-tools")
MATCHED = "free-as-"
# A stopped output is checked with its request's check: True when it is invalid (None: free, not checked).
Check = Callable[[str], bool]
MAX_MODEL_LEN = 2048


class Parts:
    """Seconds spent in named parts, summed, per kind of run."""

    def __init__(self) -> None:
        self.kind = "warmup"
        self.totals: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            key = f"{self.kind}:{name}"
            self.totals[key] = self.totals.get(key, 0.0) + seconds

    def timed(self, name: str, work: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return work(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - started)

        return run

    def take(self) -> dict[str, float]:
        with self.lock:
            totals, self.totals = self.totals, {}
        return totals


def instrument(processor: GuidanceLogitsProcessor, parts: Parts, hand_off: threading.Event) -> None:
    """Time the processor's parts in place (this process only): llguidance's calls as the worker and
    the step loop make them, and the applier's launch. While ``hand_off`` is set, the step loop waits
    for the worker to start after handing it a step (an experiment: the wait lets the worker take
    the GIL at once)."""
    import llguidance.numpy

    for name in ("consume_token_par", "fill_next_token_bitmask_par"):
        setattr(llguidance.numpy, name, parts.timed(f"llguidance.{name}", getattr(llguidance.numpy, name)))
    for name in ("_wait_for_prefetch", "mask"):
        setattr(processor, name, parts.timed(f"processor.{name}", getattr(processor, name)))
    source = processor._source  # a benchmark's instrument: the matchers' own calls, where they run
    setattr(source, "fill", parts.timed("matchers.fill", source.fill))  # noqa: B010 (this instance only)
    if isinstance(source, MaskProcess):  # its child's own time, as its replies report it
        _time_mask_process(source, parts)
        return _time_applier(processor, parts)
    if not isinstance(source, MatcherTable):
        return _time_applier(processor, parts)
    # How long the worker waits, after the step loop hands it a step, before it runs (for the GIL,
    # which the step loop's thread holds while it delivers the tokens).
    handed = [0.0]
    started = threading.Event()
    prefetch, advance = processor.prefetch, parts.timed("matchers.advance", source.advance)

    def handing(*args: Any, **kwargs: Any) -> None:
        started.clear()
        handed[0] = time.perf_counter()
        prefetch(*args, **kwargs)
        if hand_off.is_set() and processor._prefetched is not None:
            started.wait(0.005)

    def starting(*args: Any, **kwargs: Any) -> tuple[int, ...]:
        parts.add("worker.start_delay", time.perf_counter() - handed[0])
        started.set()
        return advance(*args, **kwargs)  # type: ignore[no-any-return]

    processor.prefetch = handing  # type: ignore[method-assign]
    setattr(source, "advance", starting)  # noqa: B010 (this instance only)
    _time_applier(processor, parts)


def _time_mask_process(source: MaskProcess, parts: Parts) -> None:
    """``mask_process.compute``: the child's time consuming tokens and computing masks, counted as each
    step's tokens are sent (its replies to the steps before)."""
    start, counted = source.start, [source.compute_seconds]

    def starting(*args: Any, **kwargs: Any) -> Any:
        parts.add("mask_process.compute", source.compute_seconds - counted[0])
        counted[0] = source.compute_seconds
        return start(*args, **kwargs)

    setattr(source, "start", starting)  # noqa: B010 (this instance only)


def _time_applier(processor: GuidanceLogitsProcessor, parts: Parts) -> None:
    applier = processor._applier  # a benchmark's instrument
    applier.apply = parts.timed("applier.apply", applier.apply)  # type: ignore[method-assign]


def closed_loop(
    scheduler: Scheduler,
    make: Callable[[int], tuple[EngineRequest, Check | None]],
    clients: int,
    per_client: int,
) -> list[tuple[Check | None, RecordingSink]]:
    """``clients`` threads, each sending ``per_client`` requests one after another; each done request's
    schema (None: free) and sink."""
    done: list[tuple[Check | None, RecordingSink]] = []
    lock = threading.Lock()
    counter = iter(range(clients * per_client))

    def client() -> None:
        for _ in range(per_client):
            with lock:
                index = next(counter)
            (request, check), sink = make(index), RecordingSink()
            scheduler.submit(request, sink)
            sink.wait(600)
            if sink.error is not None:
                raise RuntimeError(f"a benchmark request failed: {sink.error}")
            with lock:
                done.append((check, sink))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done


@dataclass(frozen=True)
class Variant:
    """How one cell runs: its requests' kind and the step loop's settings."""

    kind: str
    interval: float | None  # Python's thread switch interval (None: its own)
    hand_off: bool
    masks_on: str  # "default" (the scheduler's choice by rows), "worker" or "step-loop"
    launch_ahead: bool
    lanes: int | None = None  # the grammar cache's (None: as built)
    plain_tokenizer: bool | None = None

    @property
    def name(self) -> str:
        name = self.kind if self.interval is None else f"{self.kind}@{self.interval * 1000:g}ms"
        name += "+hand-off" if self.hand_off else ""
        name += "" if self.masks_on == "default" else f"+masks-on-{self.masks_on}"
        name += "" if self.lanes is None else f"+lanes{self.lanes}"
        name += "" if self.plain_tokenizer is None else ("+plain" if self.plain_tokenizer else "+text")
        return name + ("+launch-ahead" if self.launch_ahead else "")


@dataclass
class Bench:
    scheduler: Scheduler
    processor: GuidanceLogitsProcessor
    phases: PhaseTimer
    parts: Parts
    tokenizer: Any
    vocab: int
    hand_off: threading.Event
    grammars: GrammarCache


def build(arguments: argparse.Namespace) -> Bench:
    """The step loop and its post-processor on a random-weight model, instrumented."""
    device = torch.device(arguments.device)
    settings = EngineSettings(device=arguments.device, max_batch_size=max(arguments.clients))
    model, tokenizer = random_model(arguments.random_model, arguments.shape, device)
    eos = frozenset({int(tokenizer.eos_token_id)})
    engine = torch_engine(settings, model, MAX_MODEL_LEN)
    mask_process = (arguments.mask_process or ("on" if device.type == "cuda" else "off")) == "on"
    applier = bitmask_applier(device, engine.vocab_size, settings.max_batch_size, shared=mask_process)
    if arguments.llguidance_own_tokenizer:  # what the masks cost before spelled special tokens were text
        own = llguidance.hf.from_tokenizer(tokenizer, n_vocab=engine.vocab_size, eos_token=sorted(eos))
        processor = GuidanceLogitsProcessor(
            own, engine.vocab_size, settings.max_batch_size, applier=applier, mask_threads=arguments.mask_threads
        )
    else:
        processor = GuidanceLogitsProcessor.for_tokenizer(
            tokenizer,
            engine.vocab_size,
            eos,
            settings.max_batch_size,
            applier=applier,
            mask_threads=arguments.mask_threads,
            mask_process=mask_process,
            mask_processes=arguments.mask_processes,
        )
    grammars = GrammarCache(
        processor.tokenizer,
        capacity=4096,
        max_bytes=1 << 30,
        lanes=lanes_for(processor.mask_threads),
        plain_tokenizer=processor.plain_tokenizer,
    )
    scheduler = Scheduler(
        engine,
        tokenizer,
        eos,
        max_batch_size=settings.max_batch_size,
        max_model_len=MAX_MODEL_LEN,
        guidance=Guidance(processor, grammars),
    )
    parts = Parts()
    phases = PhaseTimer(scheduler, engine)
    hand_off = threading.Event()
    instrument(processor, parts, hand_off)
    scheduler.start()
    return Bench(scheduler, processor, phases, parts, tokenizer, engine.vocab_size, hand_off, grammars)


@dataclass(frozen=True)
class Requests:
    """The requests of each kind: prompts, the shared schema, JSONSchemaBench's schemas, and the tool call."""

    prompts: list[list[int]]
    own: list[tuple[dict[str, Any], str]]
    max_tokens: int
    tools: ToolCallRequests
    shared: str = field(default_factory=lambda: json_schema_grammar(SCHEMA))
    lengths: dict[str, list[int]] = field(default_factory=dict)  # each kind's latest cell's output lengths

    def maker(self, kind: str, offset: int) -> Callable[[int], tuple[EngineRequest, Check | None]]:
        def make(index: int) -> tuple[EngineRequest, Check | None]:
            request_id = f"{kind}-{offset}-{index}"
            if kind == "tools":  # as the backend prepared it
                prepared = self.tools.requests[index % len(self.tools.requests)]
                return dataclasses.replace(prepared, request_id=request_id), self.tools.invalid
            check: Check | None = None
            grammar = None
            max_tokens = self.max_tokens
            if kind.startswith(MATCHED):  # as long as the constrained requests' outputs were
                lengths = self.lengths[kind.removeprefix(MATCHED)]
                max_tokens = max(1, lengths[index % len(lengths)])
            elif kind in ("shared", "pressed"):
                check, grammar = schema_check(SCHEMA), self.shared
            elif kind == "own":
                schema, grammar = self.own[(offset + index) % len(self.own)]
                check = schema_check(schema)
            request = EngineRequest(
                request_id=request_id,
                prompt_ids=tuple(self.prompts[index % len(self.prompts)]),
                max_tokens=max_tokens,
                sampling=SamplingParams(temperature=0.0),
                stream=True,
                grammar=grammar,
                grammar_pressure=kind == "pressed",
            )
            return request, check

        return make


def schema_check(schema: dict[str, Any]) -> Check:
    def invalid(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError):
            return True
        return False

    return invalid


def failing_their_schema(done: list[tuple[Check | None, RecordingSink]]) -> int:
    """Outputs that ended with ``stop`` and fail their check: their schema, or a valid call of the tool."""
    invalid = 0
    for check, sink in done:
        last = sink.outputs[-1]
        if check is not None and last.finish_reason is not None and last.finish_reason.value == "stop":
            invalid += check(sink.text)
    return invalid


def measure(
    bench: Bench, make: Callable[[int], Any], kind: str, clients: int, per_client: int
) -> tuple[dict[str, Any], list[int]]:
    """The cell's figures, and its requests' output lengths."""
    bench.parts.kind = bench.phases.side = kind
    bench.parts.take()
    bench.phases.take()
    steps_before = bench.scheduler.counters.totals().steps
    started = time.perf_counter()
    done = closed_loop(bench.scheduler, make, clients, per_client)
    elapsed = time.perf_counter() - started
    steps = max(bench.scheduler.counters.totals().steps - steps_before, 1)
    phase_ms = bench.phases.take()
    part_s = bench.parts.take()
    sinks = [sink for _, sink in done]
    lengths = [sink.outputs[-1].completion_tokens for sink in sinks]
    cell = {
        "tokens_per_s": sum(lengths) / elapsed,
        "tbt_ms": stats_ms([gap for sink in sinks for gap in token_gaps(sink)]),
        "ttft_ms_p50": statistics.median((sink.stamps[0][0] - sink.submitted) * 1e3 for sink in sinks),
        "steps": steps,
        "ms_per_step": {k.split(":", 1)[1]: v / steps for k, v in sorted(phase_ms.items()) if k.startswith(kind)},
        "parts_ms_per_step": {
            k.split(":", 1)[1]: v * 1e3 / steps for k, v in sorted(part_s.items()) if k.startswith(kind)
        },
        "stopped_outputs_failing_their_schema": failing_their_schema(done),
        "completion_tokens_mean": statistics.mean(lengths),
        **pressure_summary(sinks),
    }
    return cell, lengths


def pressure_summary(sinks: list[RecordingSink]) -> dict[str, Any]:
    """What the grammar's pressure reports said, where the requests asked (``pressed``)."""
    reports = [sink.outputs[-1].grammar_pressure for sink in sinks]
    asked = [report for report in reports if report is not None]
    if not asked:
        return {}
    return {
        "grammar_pressure_mean_removed": statistics.mean(report.mean_removed for report in asked),
        "grammar_pressure_first_choice_forbidden_share": sum(r.first_choice_forbidden for r in asked)
        / max(sum(r.tokens for r in asked), 1),
    }


def masks_on_loop_rows(variant: Variant) -> int:
    """The scheduler's ``masks_on_loop_rows`` for ``variant``."""
    if variant.masks_on == "worker":
        return 0
    if variant.masks_on == "step-loop":
        return 1 << 30
    return MASKS_ON_LOOP_ROWS if variant.launch_ahead else 0


def configure_grammars(grammars: GrammarCache, variant: Variant, plain: PlainTextTokenizer | None) -> None:
    """The variant's lanes and tokenizer; the cache is emptied when they change, so no template outlives them."""
    lanes = grammars.lanes if variant.lanes is None else variant.lanes
    chosen = grammars.plain_tokenizer
    if variant.plain_tokenizer is not None:
        chosen = plain if variant.plain_tokenizer else None
    if (lanes, chosen) != (grammars.lanes, grammars.plain_tokenizer):
        grammars.clear()
        grammars.lanes, grammars.plain_tokenizer = lanes, chosen


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-model", type=Path, required=True, help="config + tokenizer folder: random weights")
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--mask-threads", type=int, default=None)
    parser.add_argument("--mask-processes", type=int, default=1, help="with --mask-process on: how many children")
    parser.add_argument(
        "--llguidance-own-tokenizer",
        action="store_true",
        help="llguidance.hf's tokenizer, not backend.guidance_tokenizer",
    )
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS[:3]))
    parser.add_argument(
        "--switch-intervals",
        type=float,
        nargs="+",
        default=None,
        help="seconds; each kind runs under each (default: Python's own, 0.005)",
    )
    parser.add_argument(
        "--hand-off",
        nargs="+",
        choices=("off", "on"),
        default=["off"],
        help="each kind runs with each: 'on' makes the step loop wait for the mask worker to start",
    )
    parser.add_argument(
        "--mask-process",
        choices=("off", "on"),
        default=None,
        help="'on': the matchers in a process of their own (the engine's --engine-mask-process; default: as "
        "the server does, on with CUDA, off on the CPU); one value a run: compare by running both, alternating",
    )
    parser.add_argument(
        "--masks-on",
        nargs="+",
        choices=("default", "worker", "step-loop"),
        default=["default"],
        help="each kind runs with each: where a step's masks are computed (default: the scheduler's choice)",
    )
    parser.add_argument(
        "--launch-ahead",
        nargs="+",
        choices=("off", "on"),
        default=None,
        help="each kind runs with each: 'on' queues a step's decode pass before its tokens are delivered "
        "(default: as the server does, on with CUDA, off on the CPU)",
    )
    parser.add_argument(
        "--lanes",
        type=int,
        nargs="+",
        default=None,
        help="each kind runs with each: how many compiled templates a grammar's requests copy "
        "(default: one per mask thread, 16 at most)",
    )
    parser.add_argument(
        "--plain-tokenizer",
        nargs="+",
        choices=("off", "on"),
        default=None,
        help="each kind runs with each: 'on' compiles schemas that never force a special token's spelling "
        "against llguidance's own tokenizer (default: on where the vocabulary allows)",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="step_breakdown")
    arguments = parser.parse_args(argv)
    for position, kind in enumerate(arguments.kinds):
        if kind.startswith(MATCHED) and kind.removeprefix(MATCHED) not in arguments.kinds[:position]:
            parser.error(f"--kinds {kind} takes its lengths from a {kind.removeprefix(MATCHED)} cell: list that first")
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    if arguments.launch_ahead is None:
        arguments.launch_ahead = ["on" if arguments.device.startswith("cuda") else "off"]
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    bench = build(arguments)
    own: list[tuple[dict[str, Any], str]] = []
    for _, entry in load_schemas(arguments.data) if "own" in arguments.kinds else ():
        try:
            grammar = json_schema_grammar(entry["schema"])
            check_grammar(grammar, bench.processor.tokenizer)
        except GuideError:
            continue
        own.append((entry["schema"], grammar))
    logger.info("%d schemas compile", len(own))
    template = ChatTemplate(bench.tokenizer)
    prompts = [template.render([ChatMessage("user", f"Describe person number {i} as JSON.")]) for i in range(64)]
    service = GenerationService(
        bench.tokenizer, template, bench.scheduler, vocab_size=bench.vocab, max_model_len=MAX_MODEL_LEN
    )
    tools = ToolCallRequests.prepared_by(service, 64, arguments.max_tokens)
    requests = Requests(prompts, own, arguments.max_tokens, tools)
    closed_loop(bench.scheduler, requests.maker("shared", 0), 4, 1)  # warm up
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if arguments.device.startswith("cuda") else "cpu",
        "vocab": bench.vocab,
        "max_tokens": arguments.max_tokens,
        "mask_threads": arguments.mask_threads,
        "mask_processes": arguments.mask_processes,
        "guidance_tokenizer": "llguidance.hf" if arguments.llguidance_own_tokenizer else "backend.guidance_tokenizer",
        "cells": {},
    }
    intervals: list[float | None] = list(arguments.switch_intervals or [None])
    plain = bench.grammars.plain_tokenizer
    plain_choices: list[bool | None] = [None]
    if arguments.plain_tokenizer is not None:
        plain_choices = [choice == "on" for choice in arguments.plain_tokenizer]
    variants = [
        Variant(kind, interval, hand_off == "on", masks_on, launch == "on", lanes, plain_on)
        for lanes in arguments.lanes or [None]
        for plain_on in plain_choices
        for launch in arguments.launch_ahead
        for masks_on in arguments.masks_on
        for hand_off in arguments.hand_off
        for interval in intervals
        for kind in arguments.kinds
    ]
    default_interval = sys.getswitchinterval()
    offset = 0
    for clients in arguments.clients:
        for round_index in range(arguments.rounds):
            for variant in variants if round_index % 2 == 0 else variants[::-1]:
                sys.setswitchinterval(default_interval if variant.interval is None else variant.interval)
                bench.scheduler.launch_ahead = variant.launch_ahead
                bench.scheduler.masks_on_loop_rows = masks_on_loop_rows(variant)
                configure_grammars(bench.grammars, variant, plain)
                if variant.hand_off:
                    bench.hand_off.set()
                else:
                    bench.hand_off.clear()
                make = requests.maker(variant.kind, offset)
                cell, requests.lengths[variant.kind] = measure(
                    bench, make, variant.kind, clients, arguments.requests_per_client
                )
                offset += clients * arguments.requests_per_client
                name = f"{clients}/{variant.name}"
                report["cells"].setdefault(name, []).append(cell)
                logger.info("%d clients, %s: %s", clients, name, json.dumps(cell))
                write_report(arguments.out / f"{arguments.name}.json", report)  # a run cut short keeps its cells
    bench.scheduler.shutdown()


if __name__ == "__main__":
    main()
