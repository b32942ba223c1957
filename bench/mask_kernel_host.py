"""Where the mask applier's host time per step goes, part by part.

Host figures are medians over repeated calls of one call's host time (perf_counter around it,
the GPU idle: synchronised before each call, as ``bench.mask_kernel`` times it). The parts are
timed in turn within each repeat, so the machine's drift touches them alike. The parts:

- ``python``: summing 256 small ints in the interpreter, no call out of it: how fast this host runs
  Python, to tell a slow host from a slow driver;
- ``ctypes``: a trivial driver call through ctypes (cuCtxGetCurrent): the floor of any call;
- ``pointers``: the applier's check that the logits tensor is last step's (its pointers in place);
- ``graph``: cuGraphLaunch of the step's captured graph (copy, event, kernel) alone;
- ``graph_kernel``: cuGraphLaunch of a graph of the mask kernel alone;
- ``graph_copy_kernel`` / ``graph_event_kernel``: of the mask copy, or the copy's event, and the kernel;
- ``apply``: the whole ``apply``, as the post-processor calls it;
- ``xgrammar``: xgrammar's op alone (masks already on the GPU), when ``--xgrammar`` is given.

    python -m bench.mask_kernel_host --xgrammar /tmp/xgrammar --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from backend.kernels.cuda_masking import CudaBitmaskApplier
from backend.kernels.driver import CU_EVENT_RECORD_EXTERNAL
from bench.mask_kernel import DTYPES, load_module, make_masks
from bench.reports import host_cpu, write_report

logger = logging.getLogger("bench.mask_kernel_host")


def host_us(parts: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median host µs of each part, the parts timed in turn within each repeat."""
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(repeats):
        for name, call in parts.items():
            torch.cuda.synchronize()
            started = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - started) * 1e6)
    torch.cuda.synchronize()
    return {f"{name}_us": float(statistics.median(values)) for name, values in times.items()}


def captured_graph(applier: CudaBitmaskApplier, logits: torch.Tensor, *, copy: bool, event: bool) -> ctypes.c_void_p:
    """A graph of the step's kernel, after its mask copy and the copy's event where asked (a
    diagnostic of what each node costs the graph launch: uses the applier's privates)."""
    driver = applier._driver
    step = applier._set_pointers(logits)
    assert step is not None, "no rows"
    kernel, rows = step
    plan = applier._plan(kernel, rows)

    def enqueue(stream_ptr: int) -> None:
        if copy:
            driver.check(applier._memcpy(*applier._step_copy(rows), stream_ptr), "cuMemcpyHtoDAsync")
        if event:
            recorded = driver.lib.cuEventRecordWithFlags(applier._copied, stream_ptr, CU_EVENT_RECORD_EXTERNAL)
            driver.check(recorded, "cuEventRecord")
        applier._launch(kernel, rows, stream_ptr, plan)

    return applier._capture_graph(enqueue)


def step_graph(applier: CudaBitmaskApplier, logits: torch.Tensor) -> ctypes.c_void_p:
    step = applier._set_pointers(logits)
    assert step is not None, "no rows"
    kernel, rows = step
    shape = (kernel, rows, applier._row_base, applier._row_stride, applier._plan(kernel, rows), False)
    return applier._graphs[shape]


def measure(
    ours: CudaBitmaskApplier,
    logits: torch.Tensor,
    masks: torch.Tensor,
    xgrammar_op: Callable[[torch.Tensor, torch.Tensor], None] | None,
    repeats: int,
) -> dict[str, float]:
    stream_ptr = torch.cuda.current_stream().cuda_stream
    ours.host_masks(len(masks)).copy_(masks)
    for _ in range(3):  # seen, captured, replayed
        ours.apply(logits, stream_ptr)
    torch.cuda.synchronize()
    lib = ours._driver.lib
    graphs = {
        "graph_kernel": captured_graph(ours, logits, copy=False, event=False),
        "graph_copy_kernel": captured_graph(ours, logits, copy=True, event=False),
        "graph_event_kernel": captured_graph(ours, logits, copy=False, event=True),
    }
    holder = ctypes.c_void_p()
    parts: dict[str, Callable[[], object]] = {
        "python": functools.partial(sum, range(256)),
        "ctypes": functools.partial(lib.cuCtxGetCurrent, ctypes.byref(holder)),
        "pointers": functools.partial(ours._set_pointers, logits),
        "graph": functools.partial(lib.cuGraphLaunch, step_graph(ours, logits), stream_ptr),
        **{part: functools.partial(lib.cuGraphLaunch, graph, stream_ptr) for part, graph in graphs.items()},
        "apply": functools.partial(ours.apply, logits, stream_ptr),
    }
    if xgrammar_op is not None:
        parts["xgrammar"] = functools.partial(xgrammar_op, logits, masks.to(logits.device))
    row = host_us(parts, repeats)
    for graph in graphs.values():
        lib.cuGraphExecDestroy(graph)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024, 4096])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--kinds", nargs="+", default=["all", "one"])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--xgrammar", type=Path, help="unpacked xgrammar wheel (its kernels/ folder)")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="mask_kernel_host")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device("cuda")
    xgrammar_op = None
    if arguments.xgrammar is not None:
        module = load_module(arguments.xgrammar / "xgrammar" / "kernels" / "apply_token_bitmask_inplace_cuda.py", "x")
        xgrammar_op = None if module is None else module.apply_token_bitmask_inplace_cuda
    generator = torch.Generator().manual_seed(0)
    applier = CudaBitmaskApplier(device, max(arguments.batches), arguments.vocab)
    results = []
    for dtype_name in arguments.dtypes:
        for batch in arguments.batches:
            logits = torch.randn((batch, arguments.vocab), device=device).to(DTYPES[dtype_name])
            for kind in arguments.kinds:
                masks = make_masks(kind, batch, arguments.vocab, generator)
                row: dict[str, Any] = {"dtype": dtype_name, "batch": batch, "kind": kind}
                row.update(measure(applier, logits, masks, xgrammar_op, arguments.repeats))
                results.append(row)
                logger.info("%s", json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    report = {"device": torch.cuda.get_device_name(device), "host_cpu": host_cpu(), "results": results}
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
