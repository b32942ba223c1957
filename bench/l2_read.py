"""How fast this GPU can read an array of mask words that sits in L2, whatever the kernel's layout.

The all-allowed cells of ``bench.mask_kernel`` only read the masks: a kernel must load every word to
know that it allows everything. This sweep asks what the fastest such read is, apart from any
masking: a kernel whose threads load their words (8 or 16 bytes a load, 1 to 16 loads in flight
each), AND them together and vote, in blocks of 128 to 1024 threads, one round of loads over the
whole array. Each layout is timed with CUPTI (kernel time only) on the same array, read again and
again so it stays in L2, as the benchmark's masks do. A launch that reads one 16-byte vector gives
the bare launch time that every kernel pays.

    python -m bench.l2_read --out $OUT --name l2_read_h100
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.mask_kernel import gpu_time_us
from bench.reports import host_cpu, write_report

logger = logging.getLogger("bench.l2_read")

# The mask arrays of the benchmark's all-allowed cells at 32k: batch 1024 and 4096 (1000 words a row).
DEFAULT_SIZES = (1024 * 1000 * 4, 4096 * 1000 * 4)
VECTOR_TYPES = {8: "uint2", 16: "uint4"}
_SOURCE = """
#define LOADS {loads}
typedef {vector} vector_t;
__device__ __forceinline__ unsigned int fold(uint2 v) {{ return v.x & v.y; }}
__device__ __forceinline__ unsigned int fold(uint4 v) {{ return v.x & v.y & v.z & v.w; }}
extern "C" __global__ void read_words(const vector_t* __restrict__ words, unsigned long long count, int* refused) {{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    vector_t loaded[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {{  // every load issued before the first is used
        const unsigned long long index = first + k * stride;
        if (index < count) loaded[k] = words[index]; else loaded[k] = words[0];
    }}
    unsigned int all = 0xffffffffu;
#pragma unroll
    for (int k = 0; k < LOADS; ++k) all &= fold(loaded[k]);
    if (!__all_sync(0xffffffffu, all == 0xffffffffu) && (threadIdx.x & 31) == 0) atomicOr(refused, 1);
}}
"""


@dataclass(frozen=True)
class Layout:
    """One way to read ``bytes`` of words: ``threads`` a block, ``loads`` of ``vector_bytes`` each."""

    bytes: int
    vector_bytes: int
    loads: int
    threads: int

    @property
    def vectors(self) -> int:
        return -(-self.bytes // self.vector_bytes)

    @property
    def blocks(self) -> int:
        """Blocks of one round of loads: every thread's loads together cover the array once."""
        return max(1, -(-self.vectors // (self.threads * self.loads)))


def layouts(sizes: Iterable[int], loads: Iterable[int], threads: Iterable[int]) -> list[Layout]:
    return [
        Layout(size, vector_bytes, count, block)
        for size, vector_bytes, count, block in itertools.product(sizes, VECTOR_TYPES, loads, threads)
    ]


def summary(rows: Sequence[dict[str, Any]], bare_us: float) -> dict[int, dict[str, Any]]:
    """Per array size, the fastest layout, its time and the read rate past the bare launch (TB/s)."""
    best: dict[int, dict[str, Any]] = {}
    for row in rows:
        current = best.get(row["bytes"])
        if current is None or row["us"] < current["us"]:
            best[row["bytes"]] = row
    return {
        size: row | {"tb_per_s_past_launch": size / max(row["us"] - bare_us, 1e-9) / 1e6}
        for size, row in sorted(best.items())
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="bytes of words")
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="loads in flight a thread")
    parser.add_argument("--threads", type=int, nargs="+", default=[128, 256, 512, 1024], help="threads a block")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="l2_read")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import pycuda.driver as cuda
    from pycuda.compiler import SourceModule

    device = torch.device("cuda")
    words = torch.full((max(arguments.sizes) // 4 + 4,), -1, dtype=torch.int32, device=device)
    refused = torch.zeros(1, dtype=torch.int32, device=device)
    cuda.init()
    context = cuda.Device(torch.cuda.current_device()).retain_primary_context()
    context.push()
    try:
        kernels = {
            (vector_bytes, loads): SourceModule(
                _SOURCE.format(loads=loads, vector=vector), no_extern_c=True, options=["-O3"]
            ).get_function("read_words")
            for (vector_bytes, vector), loads in itertools.product(VECTOR_TYPES.items(), arguments.loads)
        }
        for kernel in kernels.values():
            kernel.prepare("PQP")

        def time_layout(layout: Layout) -> float:
            kernel = kernels[(layout.vector_bytes, layout.loads)]
            grid, block = (layout.blocks, 1, 1), (layout.threads, 1, 1)
            args = (words.data_ptr(), layout.vectors, refused.data_ptr())
            return gpu_time_us(lambda: kernel.prepared_call(grid, block, *args), arguments.repeats, kernels_only=True)

        bare_us = time_layout(Layout(16, 16, 1, 32))
        rows = []
        for layout in layouts(arguments.sizes, arguments.loads, arguments.threads):
            row = asdict(layout) | {"blocks": layout.blocks, "us": time_layout(layout)}
            rows.append(row)
            logger.info("%s", json.dumps(row))
        torch.cuda.synchronize()
        if refused.item():
            raise RuntimeError("a read found a word that is not all ones: the kernel is wrong")
    finally:
        cuda.Context.pop()
    best = summary(rows, bare_us)
    for size, row in best.items():
        rate = row["tb_per_s_past_launch"]
        logger.info("%d bytes: fastest %.3f us (%s), %.2f TB/s past the launch", size, row["us"], row, rate)
    report = {
        "device": torch.cuda.get_device_name(device),
        "host_cpu": host_cpu(),
        "bare_launch_us": bare_us,
        "fastest": {str(size): row for size, row in best.items()},
        "results": rows,
    }
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
