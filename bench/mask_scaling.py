"""Do llguidance's parallel calls scale with threads, or with processes? (issue 51)

Each process compiles ``--rows`` matchers of one JSON schema (each its own compile, so no two share a
template's lock) and walks them through random allowed tokens, step by step: every step consumes one
token per matcher and fills every next mask with llguidance's parallel calls on ``--threads`` threads.
``--processes`` such walks run at the same time; each reports its consume and fill time per step.

    .venv/bin/python -m bench.mask_scaling --tokenizer device_carry/model_llama --rows 128 --threads 1
    .venv/bin/python -m bench.mask_scaling --tokenizer device_carry/model_llama --rows 128 --threads 2
    .venv/bin/python -m bench.mask_scaling --tokenizer device_carry/model_llama --rows 64 --processes 2
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import random
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path

import llguidance
import llguidance.numpy
import numpy as np
from llguidance import LLExecutor, LLMatcher, LLTokenizer

from backend.guidance_tokenizer import guidance_tokenizers
from backend.matcher_table import mask_words
from bench.grammar_backends import hf_tokenizer
from bench.jsonschemabench import SCHEMA
from llgtriton.guides import json_schema_grammar

logger = logging.getLogger("bench.mask_scaling")


@dataclass(frozen=True)
class Walk:
    rows: int
    threads: int
    steps: int
    consume_ms_per_step: float
    fill_ms_per_step: float
    cpu_per_wall: float  # the process's CPU time over the parallel calls' wall time: the threads at work


def _tokenizer(folder: Path) -> tuple[LLTokenizer, int]:
    """llguidance's tokenizer for ``folder`` (its ``tokenizer.json`` may be xz-compressed, as carried)."""
    hf = hf_tokenizer(folder)
    vocab = len(hf)
    eos = [hf.eos_token_id] if hf.eos_token_id is not None else []
    tokenizers = guidance_tokenizers(hf, vocab, eos)
    return (tokenizers.plain.tokenizer if tokenizers.plain else tokenizers.text), vocab


def walk(folder: Path, rows: int, threads: int, steps: int, *, seed: int, start: Callable[[], object]) -> Walk:
    """One walk; ``start`` returns once every process is ready, so that their steps run at the same time."""
    tokenizer, vocab = _tokenizer(folder)
    grammar = json_schema_grammar(SCHEMA)
    matchers = [LLMatcher(tokenizer, grammar, log_level=0) for _ in range(rows)]
    masks = np.zeros((rows, mask_words(vocab)), dtype=np.int32)
    executor = LLExecutor(num_threads=threads)
    rng = random.Random(seed)
    llguidance.numpy.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], masks)
    consume = fill = cpu = 0.0
    start()
    for _ in range(steps):
        tokens = []
        for row in range(rows):
            allowed = np.flatnonzero(np.unpackbits(masks[row].view(np.uint8), bitorder="little")[:vocab])
            tokens.append(int(allowed[rng.randrange(len(allowed))]))
        started, used = time.perf_counter(), _cpu_seconds()
        llguidance.numpy.consume_token_par(executor, list(zip(matchers, tokens, strict=True)))
        consume += time.perf_counter() - started
        cpu += _cpu_seconds() - used
        for row, matcher in enumerate(matchers):  # a finished walk starts again
            if matcher.is_accepting() or matcher.is_error() or matcher.is_stopped():
                matchers[row] = LLMatcher(tokenizer, grammar, log_level=0)
        started, used = time.perf_counter(), _cpu_seconds()
        llguidance.numpy.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], masks)
        fill += time.perf_counter() - started
        cpu += _cpu_seconds() - used
    return Walk(rows, threads, steps, consume / steps * 1e3, fill / steps * 1e3, cpu / (consume + fill))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="a Hugging Face tokenizer folder")
    parser.add_argument("--rows", type=int, default=128, help="matchers per process")
    parser.add_argument("--threads", type=int, default=1, help="llguidance's threads per process")
    parser.add_argument("--processes", type=int, default=1, help="walks running at the same time")
    parser.add_argument("--steps", type=int, default=1500)
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(arguments.processes)
    results: multiprocessing.Queue[Walk] = context.Queue()
    processes = [
        context.Process(target=_walk_into, args=(results, ready, arguments, n)) for n in range(arguments.processes)
    ]
    for process in processes:
        process.start()
    for _ in processes:
        logger.info("%s", json.dumps(asdict(results.get())))
    for process in processes:
        process.join()


def _walk_into(results: multiprocessing.Queue[Walk], ready: Barrier, arguments: argparse.Namespace, seed: int) -> None:
    results.put(
        walk(arguments.tokenizer, arguments.rows, arguments.threads, arguments.steps, seed=seed, start=ready.wait)
    )


if __name__ == "__main__":
    main()
