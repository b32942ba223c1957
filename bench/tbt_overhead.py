"""Time between tokens and time to first token, constrained vs unconstrained, side by side.

Runs the real step scheduler with the real model in this process (CPU by default). At each
batch size it alternates rounds of JSON-schema-constrained requests (schemas from
JSONSchemaBench) and the same prompts unconstrained, with the same output lengths, so that both
see the same machine state and the same batch at every step, and reports
p50/p99 time between tokens, p50 time to first token, output tokens per second, and the logits
post-processor's time per step (llguidance masks for the whole batch plus applying them).

    .venv/bin/python -m bench.tbt_overhead --batches 1 4 8 --rounds 3 --out docs/results
    python -m bench.tbt_overhead --device cuda --random-model device_carry/model --shape llama-3.2-1b \
        --batches 1 8 32 64 128   # on the GPU machine: a random-weight model of that shape
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.assembly import torch_engine
from backend.chat_template import ChatTemplate
from backend.constraints import Guidance, GuidanceLogitsProcessor
from backend.engine import Engine
from backend.grammar_cache import GrammarCache
from backend.masking import bitmask_applier
from backend.model_loader import load_model
from backend.requests import EngineRequest, SamplingParams
from backend.scheduler import Scheduler
from bench.jsonschemabench import DEFAULT_DATA, load_schemas
from bench.reports import write_report
from llgtriton.guides import GuideError, check_grammar, json_schema_grammar
from llgtriton.messages import ChatMessage
from llgtriton.settings import EngineSettings
from tests.support.harness import RecordingSink

logger = logging.getLogger("bench.tbt_overhead")


# Layer sizes of public models, for random-weight runs on the GPU machine (no checkpoint travels).
SHAPES: dict[str, dict[str, int]] = {
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
    },
}


def random_model(folder: Path, shape: str | None, device: torch.device) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(folder)
    for key, value in SHAPES.get(shape or "", {}).items():
        setattr(config, key, value)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()  # type: ignore[no-untyped-call]
    return model, AutoTokenizer.from_pretrained(folder)


class PhaseTimer:
    """Wall time the step loop spends in each phase, summed per kind of round.

    Wraps methods of the scheduler and the engine in place (this process only). A forward pass
    runs asynchronously on CUDA, so its GPU time lands in whichever phase first waits for it
    (sampling reads the chosen tokens back).
    """

    PHASES = (
        ("engine", "decode"),
        ("engine", "prefill"),
        ("scheduler", "_constrain"),
        ("scheduler", "_sample"),
        ("scheduler", "_advance"),
        ("scheduler", "_compute_masks_ahead"),
        ("scheduler", "_admit"),
        ("scheduler", "_release"),
    )

    def __init__(self, scheduler: Scheduler, engine: Engine) -> None:
        self.totals: dict[str, float] = {}
        self.side = "warmup"
        owners = {"scheduler": scheduler, "engine": engine}
        for owner_name, method in self.PHASES:
            owner = owners[owner_name]
            setattr(owner, method, self._timed(method, getattr(owner, method)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                key = f"{self.side}:{name}"
                self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - started

        return timed

    def take(self) -> dict[str, float]:
        """Milliseconds per phase since the last call, keyed ``side:phase``."""
        totals, self.totals = self.totals, {}
        return {key: seconds * 1e3 for key, seconds in sorted(totals.items())}


class TimedProcessor(GuidanceLogitsProcessor):
    """The production processor, with the wall time of each step's post-processing recorded.

    ``seconds``: the step loop's time in its post-processing call (the scheduler's
    ``_constrain``: what it hands the processor, the masks left to compute, their launch), per
    step with a constrained row; ``ahead_seconds``: the worker's time consuming tokens and
    computing the next masks, which overlaps the next forward pass.
    """

    seconds: list[float]
    ahead_seconds: list[float]

    def time_steps(self, scheduler: Scheduler) -> None:
        """Wrap ``scheduler``'s post-processing call in place (whatever its signature, so that the
        same benchmark times older step loops side by side)."""
        constrain = scheduler._constrain

        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            result = constrain(*args)
            if result[0] if isinstance(result, tuple) else result:  # (older loops returned a row count)
                self.seconds.append(time.perf_counter() - started)
            return result

        setattr(scheduler, "_constrain", timed)  # noqa: B010 (this instance only)
        # The worker's call: the matchers' own (older step loops had it on the processor).
        owner = getattr(self, "_source", self)
        name = "advance" if hasattr(owner, "advance") else "_compute_ahead"
        ahead = getattr(owner, name)

        def timed_ahead(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return ahead(*args)
            finally:
                self.ahead_seconds.append(time.perf_counter() - started)

        setattr(owner, name, timed_ahead)


def token_gaps(sink: RecordingSink) -> list[float]:
    """Seconds per token between consecutive responses (a response may carry several tokens)."""
    gaps = []
    for (t0, n0), (t1, n1) in zip(sink.stamps, sink.stamps[1:], strict=False):
        if n1 > n0:
            gaps.extend([(t1 - t0) / (n1 - n0)] * (n1 - n0))
    return gaps


def run_round(scheduler: Scheduler, requests: list[EngineRequest]) -> list[RecordingSink]:
    """Submit a burst of requests and wait for all of them.

    A constrained request's time to first token includes compiling its grammar (the scheduler
    compiles new grammars on its pool, off the step loop).
    """
    sinks = []
    for request in requests:
        sinks.append(RecordingSink())
        scheduler.submit(request, sinks[-1])
    for sink in sinks:
        sink.done.wait()
        if sink.error is not None:
            raise RuntimeError(f"a benchmark request failed: {sink.error}")
    return sinks


@dataclass
class SchemaCursor:
    """Hands out schema offsets, so each round's schemas are new to the grammar cache when there are enough."""

    next: int = 0

    def take(self, count: int) -> int:
        first, self.next = self.next, self.next + count
        return first


def stats_ms(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values) * 1e3
    return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99)), "n": len(values)}


RequestFactory = Callable[[int, int, Sequence[int] | None], list[EngineRequest]]


def measure_batch(
    scheduler: Scheduler,
    processor: TimedProcessor,
    requests: RequestFactory,
    batch: int,
    rounds: int,
    *,
    cursor: SchemaCursor,
    grammars: GrammarCache,
    phases: PhaseTimer | None = None,
) -> dict[str, Any]:
    """Rounds of constrained requests against the same prompts unconstrained, side by side; the figures.

    Each round first runs its constrained requests once, untimed, to learn their output lengths.
    The timed pair (in alternating order) is then the same constrained requests again (greedy:
    the same outputs) and the same prompts unconstrained, each asking for exactly as many tokens
    as its constrained twin produced (``max_tokens`` = that length; a random-weight model
    practically never samples EOS). Both sides therefore run the same batch at every step,
    leave it at the same steps and meet only shapes that the untimed run already met (the side
    that meets a shape first pays for the allocator's new blocks and first launches). What is
    left is the constraint's cost.

    Each round's schemas are compiled before it starts (timed separately, as ``compile_ms``);
    in serving, compiling a new schema happens on the scheduler's pool, off the step loop, and
    delays that request's first token only.
    """
    gaps: dict[bool, list[float]] = {False: [], True: []}
    ttft: dict[bool, list[float]] = {False: [], True: []}
    produced: dict[bool, list[tuple[int, float]]] = {False: [], True: []}
    lengths: dict[bool, list[int]] = {False: [], True: []}
    compile_seconds: list[float] = []
    processor_seconds: list[float] = []
    ahead_seconds: list[float] = []
    if phases is not None:
        phases.take()
    for round_index in range(rounds):
        offset = cursor.take(batch)
        for request in requests(batch, offset, None):
            assert request.grammar is not None
            started = time.perf_counter()
            grammars.matcher(request.grammar)
            compile_seconds.append(time.perf_counter() - started)
        if phases is not None:
            phases.side = "untimed"
        learned = [sink.stamps[-1][1] for sink in run_round(scheduler, requests(batch, offset, None))]
        for constrained in (True, False) if round_index % 2 else (False, True):
            if phases is not None:
                phases.side = "constrained" if constrained else "unconstrained"
            processor.seconds.clear()
            processor.ahead_seconds.clear()
            started = time.perf_counter()
            sinks = run_round(scheduler, requests(batch, offset, None if constrained else learned))
            elapsed = time.perf_counter() - started
            if constrained:
                processor_seconds.extend(processor.seconds)
                ahead_seconds.extend(processor.ahead_seconds)
            produced[constrained].append((sum(sink.stamps[-1][1] for sink in sinks), elapsed))
            lengths[constrained].extend(sink.stamps[-1][1] for sink in sinks)
            for sink in sinks:
                gaps[constrained].extend(token_gaps(sink))
                ttft[constrained].append(sink.stamps[0][0] - sink.submitted)
    free, bound = stats_ms(gaps[False]), stats_ms(gaps[True])
    phase_ms = {k: v for k, v in phases.take().items() if not k.startswith("untimed")} if phases is not None else {}
    return {
        "phase_ms_total": phase_ms,
        "unconstrained_tbt_ms": free,
        "constrained_tbt_ms": bound,
        "tbt_p50_overhead": bound["p50"] / free["p50"] - 1,
        "unconstrained_ttft_ms_p50": statistics.median(ttft[False]) * 1e3,
        "constrained_ttft_ms_p50": statistics.median(ttft[True]) * 1e3,
        "ttft_p50_overhead_ms": (statistics.median(ttft[True]) - statistics.median(ttft[False])) * 1e3,
        "compile_ms": stats_ms(compile_seconds),
        "processor_ms_per_step": stats_ms(processor_seconds),
        "masks_ahead_ms_per_step": stats_ms(ahead_seconds),
        "unconstrained_tokens_per_s": sum(n for n, _ in produced[False]) / sum(t for _, t in produced[False]),
        "constrained_tokens_per_s": sum(n for n, _ in produced[True]) / sum(t for _, t in produced[True]),
        "unconstrained_mean_tokens": statistics.mean(lengths[False]),
        "constrained_mean_tokens": statistics.mean(lengths[True]),
    }


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--context-tokens", type=int, default=0, help="pad each prompt to this many tokens (long-context steps)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--name", help="the report is <out>/<name>.json (default: from the device)")
    parser.add_argument("--kv-cache", choices=["auto", "slots", "growing"], default="auto", help="the engine's")
    parser.add_argument("--mask-threads", type=int, default=None, help="llguidance's thread pool (default: its own)")
    parser.add_argument("--random-model", type=Path, help="config + tokenizer folder: random weights, no checkpoint")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="with --random-model: override the layer sizes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--phases", action="store_true", help="also report the step loop's time per phase")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    settings = EngineSettings(
        device=arguments.device, max_batch_size=max(arguments.batches), kv_cache=arguments.kv_cache
    )
    device = torch.device(arguments.device)
    if arguments.random_model is not None:
        model, tokenizer = random_model(arguments.random_model, arguments.shape, device)
        eos: frozenset[int] = frozenset({int(tokenizer.eos_token_id)})
        max_model_len = max(2048, arguments.context_tokens + arguments.max_tokens + 64)
    else:
        loaded = load_model(settings)
        model, tokenizer, eos, max_model_len = (
            loaded.model,
            loaded.tokenizer,
            loaded.eos_token_ids,
            loaded.max_model_len,
        )
    engine = torch_engine(settings, model, max_model_len)
    logger.info("engine: %s", type(engine).__name__)
    processor = TimedProcessor.for_tokenizer(
        tokenizer,
        engine.vocab_size,
        eos,
        settings.max_batch_size,
        applier=bitmask_applier(device, engine.vocab_size, settings.max_batch_size),
        mask_threads=arguments.mask_threads,
    )
    assert isinstance(processor, TimedProcessor)
    processor.seconds, processor.ahead_seconds = [], []
    grammars = GrammarCache(processor.tokenizer, capacity=1024)
    scheduler = Scheduler(
        engine,
        tokenizer,
        eos,
        max_batch_size=settings.max_batch_size,
        max_model_len=max_model_len,
        guidance=Guidance(processor, grammars),
    )
    processor.time_steps(scheduler)
    phases = PhaseTimer(scheduler, engine) if arguments.phases else None
    cursor = SchemaCursor()
    scheduler.start()
    template = ChatTemplate(tokenizer)

    schemas: list[tuple[str, str]] = []
    for name, entry in load_schemas(arguments.data):
        try:
            grammar = json_schema_grammar(entry["schema"])
            check_grammar(grammar, processor.tokenizer)
        except GuideError:
            continue
        schemas.append((name, grammar))
    logger.info("%d schemas compile", len(schemas))

    filler = tokenizer.encode(" The quick brown fox jumps over the lazy dog.", add_special_tokens=False)

    def padded(prompt: Sequence[int]) -> tuple[int, ...]:
        """``prompt`` after enough filler text to make it ``--context-tokens`` long."""
        missing = max(0, arguments.context_tokens - len(prompt))
        return tuple((filler * (missing // len(filler) + 1))[:missing]) + tuple(prompt)

    def requests(batch: int, offset: int, twin_lengths: Sequence[int] | None) -> list[EngineRequest]:
        """Constrained requests (``twin_lengths`` None), or unconstrained ones of exactly those lengths."""
        chosen = [schemas[(offset + i) % len(schemas)] for i in range(batch)]
        return [
            EngineRequest(
                request_id=name,
                prompt_ids=padded(template.render([ChatMessage("user", f"Write a JSON object for {name}.")])),
                max_tokens=arguments.max_tokens if twin_lengths is None else max(1, twin_lengths[i]),
                sampling=SamplingParams(temperature=0.0),
                stream=True,
                grammar=grammar if twin_lengths is None else None,
            )
            for i, (name, grammar) in enumerate(chosen)
        ]

    run_round(scheduler, requests(1, cursor.take(1), None))  # warm up (first forward passes)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": f"random weights, shape {arguments.shape}" if arguments.random_model else "SmolLM2-135M-Instruct",
        "max_tokens": arguments.max_tokens,
        "context_tokens": arguments.context_tokens,
        "mask_threads": arguments.mask_threads,
        "engine": type(engine).__name__,
        "batches": {},
    }
    for batch in arguments.batches:
        result = measure_batch(
            scheduler,
            processor,
            requests,
            batch,
            arguments.rounds,
            cursor=cursor,
            grammars=grammars,
            phases=phases,
        )
        report["batches"][str(batch)] = result
        logger.info("batch %d: %s", batch, json.dumps(result))
    scheduler.shutdown()
    arguments.out.mkdir(parents=True, exist_ok=True)
    threads = f"_threads{arguments.mask_threads}" if arguments.mask_threads else ""
    default_name = f"tbt_overhead_{arguments.device.replace(':', '')}{threads}"
    write_report(arguments.out / f"{arguments.name or default_name}.json", report)


def random_checkpoint(source: Path, shape: str | None, target: Path) -> None:
    """Random weights of ``shape`` with ``source``'s config and tokenizer, saved as a checkpoint."""
    model, tokenizer = random_model(source, shape, torch.device("cpu"))
    model.to(torch.bfloat16).save_pretrained(target)
    tokenizer.save_pretrained(target)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (source / extra).exists():
            shutil.copy2(source / extra, target / extra)


if __name__ == "__main__":
    main()
