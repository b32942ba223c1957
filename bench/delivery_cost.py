"""What the step loop spends delivering one step's tokens, per row, by the decoder it detokenizes with.

Delivering a token (``OutputStream.push``: two incremental decodes, stop strings, the length
limit, the response to the sink) runs once per row per step on the step loop's thread, holding
the GIL that the mask worker also needs. This times it for ``--rows`` streaming requests that
each take the same ``--tokens`` tokens of a JSON answer, with transformers' tokenizer, with the
Rust tokenizer under it decoding twice a token (``rust_two_decodes``), and with the Rust
tokenizer's own incremental decoder (``rust``: ``backend.detokenizer.fast_decoder``, as the step
loop uses it), in alternating order over ``--rounds`` rounds. The sink appends to a list, as the
engine core's does.

    python -m bench.delivery_cost --rows 64 256 --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from backend.detokenizer import Decoder, fast_decoder
from backend.output_stream import OutputStream
from backend.requests import EngineRequest, SamplingParams
from bench.llama_model import END_OF_TEXT, tokenizer_folder
from bench.reports import host_cpu, write_report
from tests.support.harness import RecordingSink

logger = logging.getLogger("bench.delivery_cost")
ANSWER = '{"name": "Ada Lovelace", "age": 36, "city": "London", "notes": "wrote the first program — für die Engine ✓"}'
MAX_MODEL_LEN = 2048


def step_ms(decoder: Decoder, prompt: tuple[int, ...], tokens: Sequence[int], rows: int) -> tuple[float, str]:
    """Milliseconds per step to push one token to each of ``rows`` streams, over ``tokens``, and the
    text a stream streamed."""
    streams = []
    for row in range(rows):
        request = EngineRequest(str(row), prompt, len(tokens) + 1, SamplingParams(), stream=True)
        detokenizer, stop_filter = OutputStream.parts(request, decoder)
        streams.append(OutputStream(request, RecordingSink(), detokenizer, stop_filter))
    eos = frozenset({END_OF_TEXT})
    started = time.perf_counter()
    for token in tokens:
        for stream in streams:
            stream.push(token, eos, MAX_MODEL_LEN)
    elapsed = time.perf_counter() - started
    return elapsed / len(tokens) * 1e3, "".join(streams[0].text)


@dataclass(frozen=True)
class TwoDecodes:
    """The Rust decoder behind the bare :class:`Decoder` protocol: the detokenizer then decodes twice
    a token, as it did before it used the Rust decoder's own stream."""

    decoder: Decoder

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.decoder.decode(token_ids, skip_special_tokens=skip_special_tokens)


def measure(tokenizer: Any, rows: Sequence[int], tokens: int, rounds: int) -> list[dict[str, Any]]:
    answer_ids = tokenizer.encode(ANSWER * (1 + tokens // 16), add_special_tokens=False)[:tokens]
    prompt = tuple(tokenizer.encode("Describe person number 7 as JSON."))
    rust = fast_decoder(tokenizer)
    decoders: dict[str, Decoder] = {"transformers": tokenizer, "rust_two_decodes": TwoDecodes(rust), "rust": rust}
    cells = []
    for row_count in rows:
        times: dict[str, list[float]] = {name: [] for name in decoders}
        texts: set[str] = set()
        for round_index in range(rounds):
            order = list(decoders) if round_index % 2 == 0 else list(reversed(decoders))
            for name in order:
                milliseconds, text = step_ms(decoders[name], prompt, answer_ids, row_count)
                times[name].append(milliseconds)
                texts.add(text)
        if len(texts) != 1:
            raise AssertionError(f"the decoders streamed different texts: {texts}")
        cell: dict[str, Any] = {"rows": row_count}
        for name, values in times.items():
            cell[f"{name}_ms_per_step"] = [round(value, 3) for value in values]
            cell[f"{name}_us_per_row"] = round(statistics.median(values) / row_count * 1e3, 2)
        for name in ("rust_two_decodes", "rust"):
            cell[f"{name}_over_transformers"] = round(
                statistics.median(times[name]) / statistics.median(times["transformers"]), 3
            )
        cell["rust_over_rust_two_decodes"] = round(
            statistics.median(times["rust"]) / statistics.median(times["rust_two_decodes"]), 3
        )
        logger.info("%s", cell)
        cells.append(cell)
    return cells


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=None, help="a tokenizer folder (default: Llama 3.2's)")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="delivery_cost")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    folder = args.tokenizer or tokenizer_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cells = measure(tokenizer, args.rows, args.tokens, args.rounds)
    write_report(
        args.out / f"{args.name}.json",
        {"tokenizer": str(folder), "tokens": args.tokens, "host_cpu": host_cpu(), "cells": cells},
    )


if __name__ == "__main__":
    main()
