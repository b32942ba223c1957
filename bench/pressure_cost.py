"""What reporting the grammar's pressure costs a step, part by part, on one GPU (issue 53).

For each batch, with the CUDA mask applier's replayed graph (one step's mask copy, kernels):
- device time of a step's masking with and without the pressure reduction: the GPU is first put
  behind with a sleep kernel, so that the steps queued after it run back to back and the events
  around them time the device alone;
- host time of one ``apply`` call, with and without ``report_pressure``;
- host time of the step loop's read of the figures (in pinned memory once the step's stream has
  passed) and of adding each to its request's tally.

    python -m bench.pressure_cost --out $OUT
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from backend.grammar_pressure import StepPressure
from backend.kernels.cuda_masking import CudaBitmaskApplier
from backend.output_stream import PressureTally
from bench.mask_kernel import DTYPES
from bench.reports import host_cpu, write_report

logger = logging.getLogger("bench.pressure_cost")


def json_like_masks(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Masks that allow a few hundred scattered tokens, as a JSON grammar's do inside a string or
    between keys."""
    words = (vocab + 31) // 32
    allowed = torch.zeros((rows, words * 32), dtype=torch.bool)
    for row in range(rows):
        allowed[row, torch.randint(0, vocab, (300,), generator=generator)] = True
    weights = (1 << torch.arange(32, dtype=torch.int64)).view(1, 1, 32)
    return (allowed.view(rows, words, 32).to(torch.int64) * weights).sum(-1).to(torch.uint32).view(torch.int32)


def device_seconds(applier: CudaBitmaskApplier, logits: torch.Tensor, pressure: bool, steps: int) -> float:
    """Device time of one step's masking (mean of ``steps`` queued back to back behind a sleep)."""
    stream = torch.cuda.current_stream()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]  # (tens of ms: the host queues every step before the GPU gets there)
    start.record(stream)
    for _ in range(steps):
        applier.apply(logits, stream.cuda_stream, report_pressure=pressure)
    end.record(stream)
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1000 / steps


def host_seconds(applier: CudaBitmaskApplier, logits: torch.Tensor, pressure: bool, steps: int) -> list[float]:
    """Host time of each of ``steps`` ``apply`` calls, each after a synchronise."""
    stream = torch.cuda.current_stream().cuda_stream
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        applier.apply(logits, stream, report_pressure=pressure)
        times.append(time.perf_counter() - started)
    return times


def tally_seconds(applier: CudaBitmaskApplier, logits: torch.Tensor, steps: int) -> list[float]:
    """Host time of the step loop's read of a step's figures, after the step's own wait (which they
    arrived in, in pinned memory), and of adding each row to its request's tally."""
    stream = torch.cuda.current_stream()
    rows = list(range(len(logits)))
    times = []
    for _ in range(steps):
        tallies = [PressureTally() for _ in rows]
        figures = applier.apply(logits, stream.cuda_stream, report_pressure=True)
        assert figures is not None
        torch.cuda.synchronize()  # (the step loop's read of its sampled tokens)
        started = time.perf_counter()
        for tally, figure in zip(tallies, StepPressure(rows, figures).values(), strict=True):
            tally.add(figure)
        times.append(time.perf_counter() - started)
    return times


def measure(batch: int, vocab: int, dtype: torch.dtype, steps: int, rounds: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(batch)
    applier = CudaBitmaskApplier(torch.device("cuda"), batch, vocab)
    applier.host_masks(batch).copy_(json_like_masks(batch, vocab, generator))
    logits = (torch.randn((batch, vocab), generator=generator) * 3).to(dtype).cuda()
    for pressure in (False, True):  # capture both graphs first
        for _ in range(3):
            applier.apply(logits, torch.cuda.current_stream().cuda_stream, report_pressure=pressure)
    torch.cuda.synchronize()
    device: dict[bool, list[float]] = {False: [], True: []}
    host: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):  # alternating, so drift falls on both
        for pressure in (False, True):
            device[pressure].append(device_seconds(applier, logits, pressure, steps))
            host[pressure].extend(host_seconds(applier, logits, pressure, steps))
    tally = tally_seconds(applier, logits, steps * rounds)
    cell = {
        "batch": batch,
        "vocab": vocab,
        "dtype": str(dtype).removeprefix("torch."),
        "device_us_without": [round(s * 1e6, 2) for s in device[False]],
        "device_us_with": [round(s * 1e6, 2) for s in device[True]],
        "device_us_added_median": round(
            statistics.median(w - o for w, o in zip(device[True], device[False], strict=True)) * 1e6, 2
        ),
        "host_us_p50_without": round(statistics.median(host[False]) * 1e6, 2),
        "host_us_p50_with": round(statistics.median(host[True]) * 1e6, 2),
        "read_and_tally_us_p50": round(statistics.median(tally) * 1e6, 2),
    }
    logger.info("%s", cell)
    return cell


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--steps", type=int, default=200, help="steps per timing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="pressure_cost", help="the report is <out>/<name>.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cells = [measure(batch, args.vocab, DTYPES[args.dtype], args.steps, args.rounds) for batch in args.batches]
    report = {"device": torch.cuda.get_device_name(), "host_cpu": host_cpu(), "cells": cells}
    write_report(args.out / f"{args.name}.json", report)


if __name__ == "__main__":
    main()
