"""Whether a step's masks allow everything, mostly allow everything, mostly allow nothing, or
neither, from a fixed sample of them.

The chunked kernel's best grid depends on the masks. A step whose masks mostly allow everything
only reads them: a few long-lived warps with several loads in flight each do that fastest. A step
whose masks make the kernel write is fastest with one warp per chunk and its masks in L2 first,
and that includes a JSON string's masks, which refuse only 1-2% of the tokens: those are spread
over the vocabulary, so hardly a chunk of 1024 tokens allows everything. Small launches differ the
same way: all allowed, a warp per chunk that leaves after its mask words is fastest; otherwise a
vector per thread. A step whose masks mostly allow everything but not all of them (a batch in
which a few rows are constrained) is told apart from one whose sampled runs all allow everything:
its few constrained rows are what its launch waits for. Small launches also tell a fourth kind of
step apart: masks that allow almost nothing (a grammar state that admits a few tokens: a colon, a
digit, a closing brace), where a thread need not read the logits its mask word refuses. The masks
sit in pinned host memory before the launch, so a sample of them, read on the host, tells these
apart for about a microsecond.

The sample is 16 runs of 64 tokens (one int64 each). A run that allows all its tokens reads as
-1, and one that allows none as 0, both of which Python keeps preallocated, so sampling such masks
allocates nothing. A sample can miss a batch's few constrained rows: with a tenth of the rows a
JSON string's (whose runs are 38% all allowed), 16 runs miss them in about a third of the steps,
which then take the sparse plan. 64 runs would miss them in 1.6%, but took the H100 machine's host
about 2 us more a step (docs/kernel.md).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

SAMPLED_RUNS = 16  # of 64 tokens each
SPARSE_FROM = 12  # sampled runs that must allow all their tokens for the sparse or the patchy plan
REFUSED_FROM = 12  # sampled runs that must allow none of their tokens for the refused plan (by default)
# The plans a sample picks (the values of backend.kernels.cuda_masking.LaunchPlan; strings, whose
# hashes Python caches, because a step looks its plan up in a dict of captured graphs).
SPARSE, PATCHY, DENSE, REFUSED = "sparse", "patchy", "dense", "refused"
_MAX_CACHED_SHAPES = 4096  # row counts whose sample positions are kept
_ROW_HASH, _WORD_HASH = 2654435761, 2246822519  # odd multipliers (Knuth's and xxHash's primes)


def _spread(i: int, count: int, multiplier: int) -> int:
    """Sample ``i``'s place among ``count``: in the ``i``-th of ``SAMPLED_RUNS`` equal stretches, at
    an offset that a multiplicative hash of ``i`` picks (``multiplier`` is odd), so that a pattern
    that repeats every few rows is sampled at all its phases, not always at the same one."""
    start = i * count // SAMPLED_RUNS
    width = max(1, (i + 1) * count // SAMPLED_RUNS - start)
    return start + (i * multiplier >> 7) % width


class MaskDensityProbe:
    """Samples ``SAMPLED_RUNS`` runs of 64 tokens of the first ``rows`` mask rows, spread over the
    rows and over the vocabulary."""

    def __init__(self, masks: npt.NDArray[np.int32], words_per_row: int) -> None:
        """``masks``: the flat int32 buffer the rows are written to, ``words_per_row`` apart (its
        start 8-byte aligned)."""
        if masks.dtype != np.int32 or masks.ndim != 1:
            raise ValueError("masks must be a flat int32 array")
        whole = masks.size // 2 * 8  # bytes in whole int64s
        self._runs = masks.data.cast("B")[:whole].cast("q")
        self._words = masks.size
        self._words_per_row = words_per_row
        self._samplers: dict[int, Callable[[memoryview], tuple[int, ...]]] = {}

    def positions(self, rows: int) -> list[int]:
        """The int64 indices sampled from ``rows`` rows: sample ``i`` starts in the ``i``-th of
        ``SAMPLED_RUNS`` equal stretches of the rows, and of each row's words."""
        per_row = self._words_per_row
        if rows < 1 or rows * per_row > self._words:
            raise ValueError(f"{rows} rows do not fit the mask buffer")
        if rows * per_row < 2:
            raise ValueError("one mask word holds no whole run of 64 tokens to sample")
        last = rows * per_row // 2 - 1  # the last int64 wholly inside these rows
        return [
            min(last, (_spread(i, rows, _ROW_HASH) * per_row + _spread(i, per_row, _WORD_HASH)) // 2)
            for i in range(SAMPLED_RUNS)
        ]

    def plan(self, rows: int, refused_from: int | None) -> str:
        """``SPARSE`` when every sampled run allows all its tokens, ``PATCHY`` when at least
        ``SPARSE_FROM`` do but not all; otherwise ``REFUSED`` when at least ``refused_from`` allow
        none (None: the launch has no refused plan); otherwise ``DENSE``."""
        sampler = self._samplers.get(rows)
        if sampler is None:
            if rows * self._words_per_row < 2:  # not one whole run to sample
                return DENSE
            if len(self._samplers) >= _MAX_CACHED_SHAPES:
                self._samplers.clear()
            sampler = self._samplers[rows] = operator.itemgetter(*self.positions(rows))
        runs = sampler(self._runs)
        allowing = runs.count(-1)
        if allowing >= SPARSE_FROM:
            return SPARSE if allowing == SAMPLED_RUNS else PATCHY
        if refused_from is not None and runs.count(0) >= refused_from:
            return REFUSED
        return DENSE
