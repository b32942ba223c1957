"""Whether a step's masks mostly allow everything, from a fixed sample of their bytes.

The chunked kernel's best grid depends on the masks. A step whose masks mostly allow everything
only reads them: a few long-lived warps with several loads in flight each do that fastest. A step
whose masks make the kernel write (one token allowed, or a mix) is fastest with one warp per chunk
and its masks in L2 first. The masks sit in pinned host memory before the launch, so a sample of
them, read on the host, tells the two apart for about a microsecond.

The sample is bytes (eight tokens each), not words: Python keeps the ints 0-255 preallocated, so
reading a byte allocates nothing, and a sampled byte that allows all its tokens is 255.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

SAMPLED_BYTES = 16
_MAX_CACHED_SHAPES = 4096  # row counts whose sample positions are kept


def _spread(i: int, count: int, step: int) -> int:
    """Sample ``i``'s place among ``count``: in the ``i``-th of ``SAMPLED_BYTES`` equal stretches, at
    an offset that changes from one stretch to the next (``step`` is odd, so the offsets are all
    different), so a pattern that repeats every few rows is not always sampled at one phase."""
    offset = (i * step % SAMPLED_BYTES) * count // SAMPLED_BYTES
    return (i * count + offset) // SAMPLED_BYTES


class MaskDensityProbe:
    """Samples ``SAMPLED_BYTES`` bytes of the first ``rows`` mask rows, spread over the rows and over
    the vocabulary."""

    def __init__(self, masks: npt.NDArray[np.int32], words_per_row: int) -> None:
        """``masks``: the flat int32 buffer the rows are written to, ``words_per_row`` apart."""
        if masks.dtype != np.int32 or masks.ndim != 1:
            raise ValueError("masks must be a flat int32 array")
        self._bytes = masks.data.cast("B")
        self._words_per_row = words_per_row
        self._samplers: dict[int, Callable[[memoryview], tuple[int, ...]]] = {}

    def positions(self, rows: int) -> list[int]:
        """The byte offsets sampled from ``rows`` rows: sample ``i`` lies in the ``i``-th of
        ``SAMPLED_BYTES`` equal stretches of the rows, and of each row's words."""
        per_row = self._words_per_row
        if rows < 1 or rows * per_row * 4 > len(self._bytes):
            raise ValueError(f"{rows} rows do not fit the mask buffer")
        return [4 * (_spread(i, rows, 7) * per_row + _spread(i, per_row, 5)) + i % 4 for i in range(SAMPLED_BYTES)]

    def mostly_allowed(self, rows: int) -> bool:
        """At least half the sampled bytes allow all their tokens."""
        sampler = self._samplers.get(rows)
        if sampler is None:
            if len(self._samplers) >= _MAX_CACHED_SHAPES:
                self._samplers.clear()
            sampler = self._samplers[rows] = operator.itemgetter(*self.positions(rows))
        return 2 * sampler(self._bytes).count(255) >= SAMPLED_BYTES
