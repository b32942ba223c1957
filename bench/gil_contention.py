"""What a busy Python thread does to llguidance's parallel calls (issue 51).

The mask worker calls llguidance's ``consume_token_par`` and ``fill_next_token_bitmask_par``, which
release the GIL while they work and take it back to return (and, with our text-reading tokenizer,
to tokenize forced text). While another thread runs Python, as the step loop does when it
delivers tokens, each taking-back waits for that thread to let go: up to Python's switch interval.
This runs ``--rows`` matchers of one JSON schema through the tokens of a JSON text, call by call,
alone and beside a thread that only runs Python, alternating over ``--rounds``.

    python -m bench.gil_contention --tokenizer-dir device_carry/model_llama --rows 64
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np

from backend.guidance_tokenizer import guidance_tokenizer
from bench.grammar_backends import hf_tokenizer
from bench.reports import host_cpu, write_report
from llgtriton.guides import json_schema_grammar

logger = logging.getLogger("bench.gil_contention")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
}
TEXT = '{"name": "Ann Smith the third of her name", "age": 31, "city": "Paris in France"}'


@dataclass(frozen=True)
class Calls:
    """Milliseconds per token of each call, over one pass through the text."""

    consume_ms: float
    fill_ms: float


def one_pass(tokenizer: Any, grammar: str, tokens: list[int], rows: int, executor: Any) -> Calls:
    matchers = [llguidance.LLMatcher(tokenizer, grammar) for _ in range(rows)]
    masks = np.zeros((rows, (tokenizer.vocab_size + 31) // 32), dtype=np.int32)
    consume = fill = 0.0
    for token in tokens:
        started = time.perf_counter()
        llguidance.numpy.consume_token_par(executor, [(matcher, token) for matcher in matchers])
        consumed = time.perf_counter()
        llguidance.numpy.fill_next_token_bitmask_par(executor, list(zip(matchers, range(rows), strict=True)), masks)
        consume += consumed - started
        fill += time.perf_counter() - consumed
    return Calls(1000 * consume / len(tokens), 1000 * fill / len(tokens))


def beside_busy_thread(work: Any) -> Calls:
    """``work()`` on a thread of its own while this thread runs Python until it is done."""
    result: list[Calls] = []
    worker = threading.Thread(target=lambda: result.append(work()))
    worker.start()
    while worker.is_alive():
        pass  # (Python bytecode: holds the GIL until the switch interval asks it to let go)
    worker.join()
    return result[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True, help="a Hugging Face tokenizer's folder")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tokenizer",
        choices=("text", "llguidance"),
        default="text",
        help="ours (forced text read as text) or llguidance's own",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="gil_contention")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hf = hf_tokenizer(arguments.tokenizer_dir)
    eos = [int(hf.eos_token_id)]
    if arguments.tokenizer == "text":
        tokenizer = guidance_tokenizer(hf, len(hf), eos)
    else:
        tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=eos)
    grammar = json_schema_grammar(SCHEMA)
    tokens = hf.encode(TEXT, add_special_tokens=False)[:-1]  # (the last one may end the object)
    executor = llguidance.LLExecutor()
    cells: dict[str, list[Calls]] = {"alone": [], "beside a busy thread": []}
    for _ in range(arguments.rounds):
        cells["alone"].append(one_pass(tokenizer, grammar, tokens, arguments.rows, executor))
        cells["beside a busy thread"].append(
            beside_busy_thread(lambda: one_pass(tokenizer, grammar, tokens, arguments.rows, executor))
        )
    report = {
        "host_cpu": host_cpu(),
        "rows": arguments.rows,
        "tokenizer": arguments.tokenizer,
        "switch_interval_s": sys.getswitchinterval(),
        "cells": {
            name: {
                "consume_ms_per_token": [round(calls.consume_ms, 3) for calls in runs],
                "fill_ms_per_token": [round(calls.fill_ms, 3) for calls in runs],
                "consume_ms_median": round(statistics.median(calls.consume_ms for calls in runs), 3),
                "fill_ms_median": round(statistics.median(calls.fill_ms for calls in runs), 3),
            }
            for name, runs in cells.items()
        },
    }
    logger.info("%s", json.dumps(report["cells"]))
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
