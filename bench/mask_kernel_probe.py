"""Our kernel's build and launch variants side by side, on the large launches where they differ.

For each batch x vocab x dtype x mask density: the GPU time of the default kernel and of each
``--variant`` (checked bit for bit against the reference first), torch's ``fill_`` (writes every
logit) and in-place ``neg_`` (reads and writes every logit) on the same logits, and with
``--shared-mask`` the same launches again with every row reading row 0's mask: the masks then
stay in L2, so the difference is what reading them from DRAM costs. ``--after-copy`` times the
kernel of a whole step instead (``apply``: the masks' copy from pinned host memory, then the
launch; the copy's own time left out), where the masks may still be in L2 when the kernel reads
them. No peers are loaded (``bench.mask_kernel`` compares against xgrammar).

    python -m bench.mask_kernel_probe --shared-mask --variant max:10000 --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backend.kernels.cuda_masking import CudaBitmaskApplier
from backend.masking import apply_token_bitmask_cpu
from bench.mask_kernel import (
    DTYPES,
    VARIANT_HELP,
    check_equal,
    gpu_time_us,
    make_masks,
    parse_variant,
)
from bench.reports import write_report

logger = logging.getLogger("bench.mask_kernel_probe")


def measure(
    appliers: dict[str, CudaBitmaskApplier], logits: torch.Tensor, masks: torch.Tensor, arguments: argparse.Namespace
) -> dict[str, float]:
    """Each applier checked against the reference, then timed as the arguments ask."""
    stream = torch.cuda.current_stream().cuda_stream
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, masks.to(logits.device))
    work = logits.clone()  # timed launches mask this copy (shared-mask ones with row 0's mask)
    times = {}
    for label, applier in appliers.items():
        applier.host_masks(len(masks)).copy_(masks)
        check = logits.clone()
        applier.apply(check, stream)
        torch.cuda.synchronize()
        check_equal(check, expected, label)
        del check
        launch = functools.partial(applier.run_resident, work, stream)
        times[f"{label}_us"] = gpu_time_us(launch, arguments.repeats)
        if arguments.shared_mask:
            times[f"{label}_shared_mask_us"] = gpu_time_us(functools.partial(launch, mask_stride=0), arguments.repeats)
        if arguments.after_copy:
            step = functools.partial(applier.apply, work, stream)
            times[f"{label}_after_copy_us"] = gpu_time_us(step, arguments.repeats, kernels_only=True)
    return times


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[128256, 151936, 32000])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--kinds", nargs="+", default=["all", "half", "one"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--variant", action="append", default=[], type=parse_variant, help=VARIANT_HELP)
    parser.add_argument("--shared-mask", action="store_true", help="also time every launch with the masks in L2")
    parser.add_argument("--after-copy", action="store_true", help="also time the kernel right after the step's copy")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="mask_kernel_probe", help="the report is <out>/<name>.json")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    device = torch.device("cuda")
    generator = torch.Generator().manual_seed(0)
    rows = max(arguments.batches)
    results: list[dict[str, Any]] = []
    for vocab in arguments.vocabs:
        appliers = {"default": CudaBitmaskApplier(device, rows, vocab)}
        appliers |= {variant.label: variant.applier(device, rows, vocab) for variant in arguments.variant}
        for dtype_name in arguments.dtypes:
            for batch in arguments.batches:
                logits = torch.randn((batch, vocab), device=device).to(DTYPES[dtype_name])
                scratch = logits.clone()
                fill_us = gpu_time_us(functools.partial(scratch.fill_, float("-inf")), arguments.repeats)
                neg_us = gpu_time_us(scratch.neg_, arguments.repeats)
                del scratch
                for kind in arguments.kinds:
                    row: dict[str, Any] = {"vocab": vocab, "dtype": dtype_name, "batch": batch, "kind": kind}
                    row |= {"fill_us": fill_us, "neg_us": neg_us}
                    row |= measure(appliers, logits, make_masks(kind, batch, vocab, generator), arguments)
                    results.append(row)
                    logger.info(
                        "%s", json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})
                    )
                del logits
    report = {"device": torch.cuda.get_device_name(device), "results": results}
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
