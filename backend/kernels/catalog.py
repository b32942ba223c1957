"""The kernels ``mask_logits.cu`` builds for serving: one record per kernel, in one table (:data:`KERNELS`).

The launch policy picks a record by what the launch needs (family, dtype, alignment, scattering,
vectors per thread) with :func:`find`, never by editing a kernel's name; the applier loads each
record's ``name`` from the compiled module.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Family(enum.Enum):
    """How a kernel lays out its work: the device function of ``mask_logits.cu`` it instantiates."""

    CHUNKED = "mask_rows"  # a warp per 1024-logit chunk, a row per blockIdx.y
    SCAN = "scan_rows"  # the sparse plan's: resident warps read the launch's masks as one array
    FLAT = "mask_flat"  # small launches: one or two 16-byte vectors per thread
    BY_WORD = "mask_by_word"  # a warp per chunk, every chunk at once, a mask word per lane


@dataclass(frozen=True, eq=False)
class Kernel:
    """One ``extern "C"`` kernel of ``mask_logits.cu``. Each is made once, in :data:`KERNELS`, so
    records compare by identity, and a step hashes one at C speed (a field-wise hash runs Python)."""

    name: str
    dtype: torch.dtype
    family: Family
    vector: int  # elements a lane moves at once: a 16-byte vector, or 1 for rows not 16-byte aligned
    scatter: bool  # mixed vectors get -inf stored into their refused elements, never read
    per_thread: int = 1  # (FLAT) 16-byte vectors per thread

    @property
    def aligned(self) -> bool:
        """Whether the kernel needs every row to start on 16 bytes."""
        return self.vector > 1

    def __repr__(self) -> str:
        return f"Kernel({self.name})"


_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16
_CHUNKED, _SCAN, _FLAT, _BY_WORD = Family.CHUNKED, Family.SCAN, Family.FLAT, Family.BY_WORD

# fp32 kernels always scatter into mixed vectors; 16-bit ones read them, except the _scatter builds
# (launches that fit in L2, and small launches whose masks refuse most logits: docs/kernel.md).
KERNELS: tuple[Kernel, ...] = (
    Kernel("mask_f32_v4", _F32, _CHUNKED, 4, scatter=True),
    Kernel("mask_f32_v1", _F32, _CHUNKED, 1, scatter=False),
    Kernel("mask_f16_v8", _F16, _CHUNKED, 8, scatter=False),
    Kernel("mask_f16_v8_scatter", _F16, _CHUNKED, 8, scatter=True),
    Kernel("mask_f16_v1", _F16, _CHUNKED, 1, scatter=False),
    Kernel("mask_bf16_v8", _BF16, _CHUNKED, 8, scatter=False),
    Kernel("mask_bf16_v8_scatter", _BF16, _CHUNKED, 8, scatter=True),
    Kernel("mask_bf16_v1", _BF16, _CHUNKED, 1, scatter=False),
    Kernel("scan_f32_v4", _F32, _SCAN, 4, scatter=True),
    Kernel("scan_f16_v8", _F16, _SCAN, 8, scatter=False),
    Kernel("scan_f16_v8_scatter", _F16, _SCAN, 8, scatter=True),
    Kernel("scan_bf16_v8", _BF16, _SCAN, 8, scatter=False),
    Kernel("scan_bf16_v8_scatter", _BF16, _SCAN, 8, scatter=True),
    Kernel("flat_f32_v4", _F32, _FLAT, 4, scatter=True),
    Kernel("flat_f32_v4_x2", _F32, _FLAT, 4, scatter=True, per_thread=2),
    Kernel("flat_f16_v8", _F16, _FLAT, 8, scatter=False),
    Kernel("flat_bf16_v8", _BF16, _FLAT, 8, scatter=False),
    Kernel("flat_f16_v8_scatter", _F16, _FLAT, 8, scatter=True),
    Kernel("flat_bf16_v8_scatter", _BF16, _FLAT, 8, scatter=True),
    Kernel("words_f32", _F32, _BY_WORD, 4, scatter=False),
    Kernel("words_f16", _F16, _BY_WORD, 8, scatter=False),
    Kernel("words_bf16", _BF16, _BY_WORD, 8, scatter=False),
)
DTYPES = frozenset(kernel.dtype for kernel in KERNELS)
SCAN_KERNELS = tuple(kernel for kernel in KERNELS if kernel.family is _SCAN)
FLAT_KERNELS = tuple(kernel for kernel in KERNELS if kernel.family is _FLAT)
_BY_LAYOUT = {(k.family, k.dtype, k.aligned, k.scatter, k.per_thread): k for k in KERNELS}
_BY_NAME = {kernel.name: kernel for kernel in KERNELS}
assert len(_BY_LAYOUT) == len(_BY_NAME) == len(KERNELS), "two kernels of one layout, or of one name"


def scatters(dtype: torch.dtype) -> bool:
    """Whether the aligned chunked and small-launch kernels of ``dtype`` scatter into mixed vectors in
    every build: fp32's do; 16-bit ones have a reading build and a _scatter one."""
    return dtype == _F32


def find(
    family: Family, dtype: torch.dtype, *, aligned: bool = True, scatter: bool = False, per_thread: int = 1
) -> Kernel:
    """The kernel of ``family`` for rows of ``dtype`` with that alignment, scattering and vectors per thread."""
    found = _BY_LAYOUT.get((family, dtype, aligned, scatter, per_thread))
    if found is None:
        layout = f"aligned={aligned}, scatter={scatter}, per_thread={per_thread}"
        raise ValueError(f"no {family.value} kernel for {dtype} ({layout})")
    return found


def named(name: str) -> Kernel:
    """The kernel called ``name`` in ``mask_logits.cu`` (for tests and benchmarks)."""
    return _BY_NAME[name]
