"""Which kernel a step's mask launch takes, in what grid and with what plan: pure Python, testable on a CPU.

:class:`LaunchPolicy` turns a step (logits dtype and alignment, rows, the plan a sample of its masks
picks) into a frozen :class:`Launch` record, from the device's facts (:class:`DeviceFacts`) and
the settings a benchmark may override (:class:`PolicySettings`). The applier
(``cuda_masking.py``) only carries the record out. Each rule's measurements: docs/kernel.md.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from backend.kernels.catalog import DTYPES, KERNELS, Family, Kernel, find, scatters
from backend.kernels.mask_probe import DENSE, PATCHY, REFUSED, REFUSED_FROM, SPARSE

THREADS_PER_BLOCK = 256
_LOGITS_PER_WARP = 1024
# Blocks of the chunked kernel's sparse plan for unaligned rows: half a wave, four waves for the largest
# launches (docs/kernel.md, "The sparse kernel's grid").
_SPARSE_WAVES = 0.5
_SPARSE_WAVES_LARGE = 4
_SPARSE_HALF_WAVE_MAX_BYTES = 768 << 20
# Below this many bytes of logits a launch is latency-bound: a vector or a few per thread (mask_flat).
FLAT_MAX_BYTES = 8 << 20
# fp32 small launches past half a wave of one-vector blocks take two vectors per thread
# (docs/kernel.md, "Two vectors per thread for fp32 small launches").
_FLAT_TWO_FROM_WAVE = 0.5
# Aligned 16-bit launches up to WORDS_MAX_BYTES: one warp per chunk, every chunk at once (mask_by_word;
# docs/kernel.md, "One warp per chunk for mid-size 16-bit launches"). Small launches whose masks mostly
# allow everything take it too: a warp leaves after one coalesced load (LaunchPlan.SPARSE).
WORDS_MAX_BYTES = 24 << 20
# fp32 two-vector small launches whose one-vector grid takes one to _FLAT_ONE_REFUSED_WAVES waves take one
# vector per thread when their masks allow nothing (docs/kernel.md, "fp32 small launches just over a wave").
_FLAT_ONE_REFUSED_WAVES = 1.5
# Aligned mid-size fp32 launches whose sampled runs allow nothing in MID_REFUSED_FROM of them take the
# two-vector small-launch kernel (docs/kernel.md, "Mid-size fp32 launches that write most of their logits").
MID_REFUSED_FROM = 4
# The dense plan: a warp per chunk; large launches prefetch their masks into L2, and launches with more masks
# run as row groups whose masks fit (docs/kernel.md, "Prefetching masks and row groups").
GROUP_MASK_BYTES = 16 << 20
PREFETCH_MIN_LOGITS_BYTES = 128 << 20
# The sparse plan's kernel for aligned rows (scan_rows): warps (up to _SCAN_WAVES times the blocks all
# SMs hold, scan_blocks) walk the launch's masks as one array, more words in flight per warp than mask_rows.
_SCAN_WAVES = 1.0
_SCAN_PIECE_WORDS = 64  # mask words a warp checks at once (SCAN_PIECE_WORDS in mask_logits.cu)
# Pieces of mask words a scan warp takes before the grid grows: one round of loads (docs/kernel.md,
# "Pieces per scan warp").
SCAN_WARP_PIECES = 8
_SCAN_PATCHY_WARP_PIECES = 1
_SPARSE_LAYOUTS = frozenset({SPARSE, PATCHY})  # plans that, once resolved, take the sparse plan's kernels
# Steps whose sampled runs mostly, not all, allow everything (LaunchPlan.PATCHY): every constrained chunk its
# own warp up to these sizes (docs/kernel.md, "The patchy plan's sizes").
PATCHY_WORDS_MAX_BYTES = 128 << 20
PATCHY_DENSE_MAX_CHUNKS = 32768
_PATCHY_SCATTER_WAVES = 1.5
# The kernels whose launch follows a LaunchPlan, sampled from each step's masks.
_PLANNED_KERNELS = frozenset(kernel for kernel in KERNELS if kernel.family in (Family.CHUNKED, Family.FLAT))
_FLAT_F32_ONE = find(Family.FLAT, torch.float32, scatter=True)
_FLAT_F32_TWO = find(Family.FLAT, torch.float32, scatter=True, per_thread=2)


class LaunchPlan(enum.Enum):
    """How a chunked or small launch is laid out, chosen per step from a sample of its masks (the
    mid-size 16-bit launches' kernel has one layout)."""

    SPARSE = SPARSE  # nearly every sampled run allows everything: masks read as one array, or
    # (small launches) a warp per chunk that leaves after its mask words
    DENSE = DENSE  # the kernel writes: a warp per chunk, masks prefetched into L2, row groups; or
    # (small launches) a vector per thread
    REFUSED = REFUSED  # (16-bit small launches, mid-size aligned fp32 ones, fp32 small ones of two
    # vectors per thread in a band of sizes) nearly every sampled run allows nothing: a vector or two
    # per thread, never reading the logits its mask refuses (other launches take the dense plan)
    PATCHY = PATCHY  # most sampled runs allow everything, not all: every constrained chunk its own
    # warp up to a size (patchy_launch), above it the sparse plan's kernels with a piece per warp


def _checked_flat_threads(threads: int) -> int:
    """Threads per small-launch block: whole warps, at most the kernels' launch bounds."""
    if threads % 32 or not 32 <= threads <= 1024:
        raise ValueError(f"flat_threads must be a multiple of 32 up to 1024, not {threads}")
    return threads


def _checked_scan_warp_pieces(pieces: int) -> int:
    if pieces < 1:
        raise ValueError(f"scan_warp_pieces must be at least 1, not {pieces}")
    return pieces


def scan_blocks(pieces: int, warps_per_block: int, resident_blocks: int, warp_pieces: int = SCAN_WARP_PIECES) -> int:
    """Blocks of a scan_rows launch over ``pieces`` pieces of mask words: enough that each warp
    takes at most ``warp_pieces`` of them, and no more than ``resident_blocks`` (all the SMs hold
    at once; past that, the resident warps take the pieces in rounds)."""
    per_block = warps_per_block * warp_pieces
    return max(1, min(resident_blocks, (pieces + per_block - 1) // per_block))


def patchy_launch(
    kernel: Kernel,
    rows: int,
    vocab: int,
    *,
    scatter_max_rows: int,
    words_max_bytes: int = PATCHY_WORDS_MAX_BYTES,
    dense_max_chunks: int = PATCHY_DENSE_MAX_CHUNKS,
) -> tuple[Kernel, str | None]:
    """The kernel and plan (None: the kernel has one layout) that a launch of ``kernel`` over
    ``rows`` rows of ``vocab`` logits takes when its masks' sample finds it patchy
    (``scatter_max_rows``: the most rows a 16-bit small launch scatters into). PATCHY, for chunked
    launches past these sizes: the sparse plan's kernels, their warps spread one piece each."""
    if kernel.family is Family.FLAT:
        if kernel.scatter:  # (fp32: the kernel scatters already)
            return kernel, DENSE
        if rows <= scatter_max_rows:
            return find(Family.FLAT, kernel.dtype, scatter=True), DENSE
        return kernel, SPARSE
    aligned_chunked = kernel.family is Family.CHUNKED and kernel.aligned
    if aligned_chunked and not scatters(kernel.dtype) and rows * vocab * kernel.dtype.itemsize <= words_max_bytes:
        return find(Family.BY_WORD, kernel.dtype), None
    chunks = (vocab + _LOGITS_PER_WARP - 1) // _LOGITS_PER_WARP
    if aligned_chunked and scatters(kernel.dtype) and rows * chunks <= dense_max_chunks:
        return kernel, DENSE
    return kernel, PATCHY


@dataclass(frozen=True)
class DeviceFacts:
    """What the policy needs to know of the GPU: its SMs, its L2, and how many blocks of each scan
    kernel all SMs hold at once (the driver's occupancy, at ``PolicySettings.chunk_threads``)."""

    sms: int
    l2_bytes: int
    scan_resident_blocks: Mapping[Kernel, int]


@dataclass(frozen=True)
class PolicySettings:
    """The policy's settings, each at the value measured best; the benchmark's comparisons and the
    tests override them.

    ``waves`` (fixed, instead of by launch size); ``flat_max_bytes`` (the largest launch of one
    vector per thread); ``chunk_threads`` (threads per block of the chunked kernels, at most 256);
    ``scatter16_max_bytes`` (the largest 16-bit launch whose mixed vectors are scattered into;
    None: the device's L2 size); ``words_max_bytes`` (the largest 16-bit launch above
    ``flat_max_bytes`` of one warp per chunk, every chunk at once, and the largest aligned fp32 one
    that takes the refused plan); ``flat_per_thread`` (vectors per thread of the fp32 small-launch
    kernel, 1 or 2, instead of by launch size); ``group_mask_bytes`` (chunked launches whose masks
    exceed it run as dense-plan row groups; None: never); ``plan`` (every chunked or small launch
    laid out so, instead of by its masks; launches without a refused plan take the dense one for
    it); ``flat_threads`` (threads per block of the small-launch kernels, a multiple of 32, at
    most their launch bounds); ``scan_warp_pieces`` (pieces of mask words each warp of the sparse
    plan's kernel takes before its grid grows).
    """

    waves: float | None = None
    flat_max_bytes: int = FLAT_MAX_BYTES
    chunk_threads: int = THREADS_PER_BLOCK
    scatter16_max_bytes: int | None = None
    words_max_bytes: int = WORDS_MAX_BYTES
    flat_per_thread: int | None = None
    group_mask_bytes: int | None = GROUP_MASK_BYTES
    plan: LaunchPlan | None = None
    flat_threads: int = THREADS_PER_BLOCK
    scan_warp_pieces: int = SCAN_WARP_PIECES


@dataclass(frozen=True)
class Launch:
    """One step's mask launch: the kernel, its grid (``blocks`` x ``rows`` blocks of ``threads``),
    the plan it follows (None: the kernel has one layout), whether it prefetches its masks into L2,
    and, for a launch run as row groups, each group's ``(first row, rows)``: one launch each, of
    ``blocks`` x that group's rows."""

    kernel: Kernel
    blocks: int
    rows: int
    threads: int
    plan: LaunchPlan | None
    prefetch: bool = False
    groups: tuple[tuple[int, int], ...] = field(default=())


@dataclass(frozen=True)
class _Refusal:
    """A launch's refused plan: the kernel it takes when at least ``from_runs`` sampled runs allow
    nothing, for launches of more than ``above_rows`` rows and at most ``max_rows``."""

    kernel: Kernel
    from_runs: int
    above_rows: int
    max_rows: int


class LaunchPolicy:
    """The launches of one vocabulary's masks on one device (worked out once per shape, so a step
    only looks them up)."""

    def __init__(self, vocab_size: int, device: DeviceFacts, settings: PolicySettings | None = None) -> None:
        settings = settings or PolicySettings()
        self.settings = settings
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._chunks = (vocab_size + _LOGITS_PER_WARP - 1) // _LOGITS_PER_WARP
        self.device = device
        self._chunk_threads = settings.chunk_threads
        self._wave_blocks = device.sms * (2048 // settings.chunk_threads)
        self._flat_threads = _checked_flat_threads(settings.flat_threads)
        self._flat_wave_blocks = device.sms * (2048 // settings.flat_threads)  # (flat_f32_v4's registers allow it)
        self._scan_warp_pieces = _checked_scan_warp_pieces(settings.scan_warp_pieces)
        self._flat_two_above_rows = self._flat_two_threshold(settings.flat_per_thread)
        # (patchy 16-bit small launches scatter while their grid fits in _PATCHY_SCATTER_WAVES waves)
        flat_16_scatter = find(Family.FLAT, torch.bfloat16, scatter=True)
        self._patchy_scatter_max_rows = self.flat_rows_within(flat_16_scatter, _PATCHY_SCATTER_WAVES)
        self._forced_plan: str | None = None if settings.plan is None else settings.plan.value
        group_mask_bytes = settings.group_mask_bytes
        self._group_rows = sys.maxsize if group_mask_bytes is None else max(1, group_mask_bytes // (self.words * 4))
        self._refusals = self._refused_plans(settings)
        scatter16 = settings.scatter16_max_bytes
        self._scatter16_max_bytes = device.l2_bytes if scatter16 is None else scatter16
        self._kernels: dict[tuple[torch.dtype, bool, int], Kernel] = {}
        self._launches: dict[tuple[Kernel, int, str | None, bool], Launch] = {}

    def _refused_plans(self, settings: PolicySettings) -> dict[Kernel, _Refusal]:
        """The kernels whose launches have a refused plan: 16-bit small launches of any size; fp32
        two-vector small ones whose one-vector grid takes one wave to _FLAT_ONE_REFUSED_WAVES (none
        when flat_per_thread is forced); mid-size aligned fp32 ones up to the mid-size bound."""
        one_refused = (
            (self.flat_rows_within(_FLAT_F32_ONE, 1.0), self.flat_rows_within(_FLAT_F32_ONE, _FLAT_ONE_REFUSED_WAVES))
            if settings.flat_per_thread is None
            else (0, 0)
        )
        refusals = {
            find(Family.FLAT, dtype): _Refusal(find(Family.FLAT, dtype, scatter=True), REFUSED_FROM, 0, sys.maxsize)
            for dtype in (torch.float16, torch.bfloat16)
        }
        refusals[_FLAT_F32_TWO] = _Refusal(_FLAT_F32_ONE, REFUSED_FROM, *one_refused)
        mid_max_rows = settings.words_max_bytes // (self.vocab_size * 4)
        mid = find(Family.CHUNKED, torch.float32, scatter=True)
        refusals[mid] = _Refusal(_FLAT_F32_TWO, MID_REFUSED_FROM, 0, mid_max_rows)
        return refusals

    # The step's kernel and plan ----------------------------------------------------------------

    def kernel(self, dtype: torch.dtype, aligned: bool, rows: int) -> Kernel:
        """The kernel for ``rows`` rows of ``dtype`` logits (``aligned``: every row starts on 16 bytes),
        before its plan resolves it."""
        key = (dtype, aligned, rows)
        found = self._kernels.get(key)
        if found is None:
            found = self._kernels[key] = self._pick_kernel(dtype, aligned, rows)
        return found

    def _pick_kernel(self, dtype: torch.dtype, aligned: bool, rows: int) -> Kernel:
        if dtype not in DTYPES:
            raise ValueError(f"no mask kernel for {dtype}")
        if not aligned:
            return find(Family.CHUNKED, dtype, aligned=False)
        logits_bytes = rows * self.vocab_size * dtype.itemsize
        fp32 = scatters(dtype)
        if logits_bytes <= self.settings.flat_max_bytes:
            two = fp32 and rows > self._flat_two_above_rows
            return find(Family.FLAT, dtype, scatter=fp32, per_thread=2 if two else 1)
        if logits_bytes <= self.settings.words_max_bytes and not fp32:
            return find(Family.BY_WORD, dtype)
        return find(Family.CHUNKED, dtype, scatter=fp32 or logits_bytes <= self._scatter16_max_bytes)

    def plan(self, kernel: Kernel, rows: int, sample: Callable[[int, int | None], str]) -> str | None:
        """The plan (LaunchPlan's value) a chunked or small launch takes: the forced one, or what
        ``sample(rows, refused_from)`` reads from the step's masks (None for the other kernels; only
        16-bit small launches, fp32 ones of two vectors per thread in a band of sizes, and mid-size
        aligned fp32 ones take the refused plan)."""
        if kernel not in _PLANNED_KERNELS:
            return None
        refusal = self._refusals.get(kernel)  # (None, or a size outside its rows: no refused plan)
        in_band = refusal is not None and refusal.above_rows < rows <= refusal.max_rows
        refused_from = refusal.from_runs if refusal is not None and in_band else None
        forced = self._forced_plan
        if forced is not None:
            return DENSE if forced == REFUSED and refused_from is None else forced
        return sample(rows, refused_from)  # (launch resolves PATCHY with patchy_launch)

    def launch(self, kernel: Kernel, rows: int, plan: str | None, masks_back_to_back: bool = True) -> Launch:
        """The launch of ``kernel`` over ``rows`` rows with ``plan`` (``masks_back_to_back``: row i's
        mask right after row i - 1's, as the applier lays them out)."""
        key = (kernel, rows, plan, masks_back_to_back)
        found = self._launches.get(key)
        if found is None:
            found = self._launches[key] = self._resolve(kernel, rows, plan, masks_back_to_back)
        return found

    def _resolve(self, kernel: Kernel, rows: int, plan: str | None, masks_back_to_back: bool) -> Launch:
        if plan == PATCHY:
            kernel, plan = patchy_launch(kernel, rows, self.vocab_size, scatter_max_rows=self._patchy_scatter_max_rows)
        if plan in _SPARSE_LAYOUTS:  # (PATCHY here: patchy_launch's large launches)
            if kernel.family is Family.CHUNKED and kernel.aligned and masks_back_to_back:
                kernel = find(Family.SCAN, kernel.dtype, scatter=kernel.scatter)
            elif kernel.family is Family.FLAT:
                kernel = find(Family.BY_WORD, kernel.dtype)
        elif plan == REFUSED:
            kernel = self._refusals[kernel].kernel
        grouped = plan == DENSE and rows > self._group_rows and kernel.family is Family.CHUNKED
        blocks, grid_rows, threads = self.grid(kernel, self._group_rows if grouped else rows, plan)
        launch_plan = None if plan is None else LaunchPlan(plan)
        if grouped:
            groups = tuple(self.row_groups(rows))
            return Launch(kernel, blocks, grid_rows, threads, launch_plan, groups=groups)
        return Launch(kernel, blocks, grid_rows, threads, launch_plan, prefetch=self.prefetches(kernel, rows, plan))

    def row_groups(self, rows: int) -> list[tuple[int, int]]:
        """``(first row, rows)`` of each launch of a chunked step: consecutive groups of about equal
        size whose masks take at most ``group_mask_bytes`` (one group when they all do)."""
        groups = (rows + self._group_rows - 1) // self._group_rows
        size = (rows + groups - 1) // groups
        return [(first, min(size, rows - first)) for first in range(0, rows, size)]

    def prefetches(self, kernel: Kernel, rows: int, plan: str | None) -> bool:
        """Whether a launch of ``rows`` rows prefetches its masks into L2 before its stores (dense plan)."""
        masks_fit = rows * self.words * 4 <= GROUP_MASK_BYTES
        large = rows * self.vocab_size * kernel.dtype.itemsize > PREFETCH_MIN_LOGITS_BYTES
        return plan == DENSE and masks_fit and large

    # Grids -------------------------------------------------------------------------------------

    def _flat_two_threshold(self, flat_per_thread: int | None) -> int:
        """Rows above which an fp32 small launch takes two vectors per thread: where one each would
        take most of a wave, or as ``flat_per_thread`` says."""
        if flat_per_thread not in (None, 1, 2):
            raise ValueError("flat_per_thread must be 1, 2 or None")
        if flat_per_thread is not None:
            return 0 if flat_per_thread == 2 else sys.maxsize
        return self.flat_rows_within(_FLAT_F32_ONE, _FLAT_TWO_FROM_WAVE)

    def flat_rows_within(self, kernel: Kernel, waves: float) -> int:
        """The most rows a launch of small-launch ``kernel`` takes with its grid in ``waves`` waves of blocks."""
        return int(waves * self._flat_wave_blocks) // self.grid(kernel, 1)[0]

    def grid(self, kernel: Kernel, rows: int, plan: str | None = None) -> tuple[int, int, int]:
        """Blocks in x and y (y is the row) and threads per block."""
        family = kernel.family
        if family is Family.FLAT:  # a few vectors per thread
            per_block = self._flat_threads * kernel.vector * kernel.per_thread
            return (self.vocab_size + per_block - 1) // per_block, rows, self._flat_threads
        if family is Family.BY_WORD:  # a mask word per thread
            per_block = THREADS_PER_BLOCK * 32
            return (self.vocab_size + per_block - 1) // per_block, rows, THREADS_PER_BLOCK
        threads = self._chunk_threads
        warps = threads // 32
        settings_waves = self.settings.waves
        if family is Family.SCAN:  # resident warps over the launch's pieces of mask words
            waves = _SCAN_WAVES if settings_waves is None else settings_waves
            resident = max(1, int(self.device.scan_resident_blocks[kernel] * waves))
            pieces = (rows * self.words + _SCAN_PIECE_WORDS - 1) // _SCAN_PIECE_WORDS
            warp_pieces = _SCAN_PATCHY_WARP_PIECES if plan == PATCHY else self._scan_warp_pieces
            return scan_blocks(pieces, warps, resident, warp_pieces), 1, threads
        chunk_blocks = (self._chunks + warps - 1) // warps
        if settings_waves is not None:
            waves = settings_waves
        elif plan in _SPARSE_LAYOUTS:
            large = rows * self.vocab_size * kernel.dtype.itemsize > _SPARSE_HALF_WAVE_MAX_BYTES
            waves = _SPARSE_WAVES_LARGE if large else _SPARSE_WAVES
        else:  # a warp per chunk
            return chunk_blocks, rows, threads
        blocks = max(1, min(chunk_blocks, (int(self._wave_blocks * waves) + rows - 1) // rows))
        return blocks, rows, threads
