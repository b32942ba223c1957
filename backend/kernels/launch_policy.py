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

from backend.kernels.mask_probe import DENSE, PATCHY, REFUSED, REFUSED_FROM, SPARSE

THREADS_PER_BLOCK = 256
_LOGITS_PER_WARP = 1024
# Blocks of the chunked kernel's sparse plan for unaligned rows: half a wave, four waves for the largest
# launches (docs/kernel.md, "The sparse kernel's grid").
_SPARSE_WAVES = 0.5
_SPARSE_WAVES_LARGE = 4
_SPARSE_HALF_WAVE_MAX_BYTES = 768 << 20
_KERNELS = {
    (torch.float32, True): "mask_f32_v4",
    (torch.float32, False): "mask_f32_v1",
    (torch.float16, True): "mask_f16_v8",
    (torch.float16, False): "mask_f16_v1",
    (torch.bfloat16, True): "mask_bf16_v8",
    (torch.bfloat16, False): "mask_bf16_v1",
}
NAIVE_KERNELS = {torch.float32: "naive_f32", torch.float16: "naive_f16", torch.bfloat16: "naive_bf16"}
# Below this many bytes of logits a launch is latency-bound: a vector or a few per thread (mask_flat).
FLAT_MAX_BYTES = 8 << 20
_FLAT_KERNELS = {"mask_f32_v4": "flat_f32_v4", "mask_f16_v8": "flat_f16_v8", "mask_bf16_v8": "flat_bf16_v8"}
# fp32 small launches past half a wave of one-vector blocks take two vectors per thread
# (docs/kernel.md, "Two vectors per thread for fp32 small launches").
_FLAT_TWO_PER_THREAD = {"flat_f32_v4": "flat_f32_v4_x2"}
_FLAT_TWO_FROM_WAVE = 0.5
# Each small-launch kernel: (elements per 16-byte vector, vectors per thread).
_FLAT_SHAPES = {
    "flat_f32_v4": (4, 1),
    "flat_f32_v4_x2": (4, 2),
    "flat_f16_v8": (8, 1),
    "flat_bf16_v8": (8, 1),
    "flat_f16_v8_scatter": (8, 1),
    "flat_bf16_v8_scatter": (8, 1),
}
# Aligned 16-bit launches up to WORDS_MAX_BYTES: one warp per chunk, every chunk at once (mask_by_word;
# docs/kernel.md, "One warp per chunk, every chunk at once").
WORDS_MAX_BYTES = 24 << 20
_WORDS_KERNELS = {"mask_f16_v8": "words_f16", "mask_bf16_v8": "words_bf16"}
# Small launches whose masks mostly allow everything take mask_by_word too: a warp leaves after one
# coalesced load (docs/kernel.md, "Small launches whose masks mostly allow everything").
_FLAT_SPARSE_KERNELS = {
    "flat_f32_v4": "words_f32",
    "flat_f32_v4_x2": "words_f32",
    "flat_f16_v8": "words_f16",
    "flat_bf16_v8": "words_bf16",
}
# 16-bit small launches whose masks mostly allow nothing: no thread reads a logit its mask refuses
# (LaunchPlan.REFUSED; docs/kernel.md, "Small launches whose masks mostly allow nothing").
_FLAT_REFUSED_KERNELS = {"flat_f16_v8": "flat_f16_v8_scatter", "flat_bf16_v8": "flat_bf16_v8_scatter"}
# fp32 two-vector small launches whose one-vector grid takes one to _FLAT_ONE_REFUSED_WAVES waves take one
# vector per thread when their masks allow nothing (docs/kernel.md, "fp32 small launches just over a wave").
_FLAT_ONE_REFUSED_KERNELS = {"flat_f32_v4_x2": "flat_f32_v4"}
_FLAT_ONE_REFUSED_WAVES = 1.5
# Aligned mid-size fp32 launches whose sampled runs allow nothing in MID_REFUSED_FROM of them take the
# two-vector small-launch kernel (docs/kernel.md, "Mid-size fp32 launches that write most of their logits").
_MID_REFUSED_KERNELS = {"mask_f32_v4": "flat_f32_v4_x2"}
MID_REFUSED_FROM = 4
_REFUSED_KERNELS = {**_FLAT_REFUSED_KERNELS, **_FLAT_ONE_REFUSED_KERNELS, **_MID_REFUSED_KERNELS}
# The mask_by_word builds, whose grid covers every chunk once whatever the plan or waves.
_BY_WORD_KERNELS = frozenset({*_WORDS_KERNELS.values(), *_FLAT_SPARSE_KERNELS.values()})
# The dense plan: a warp per chunk; large launches prefetch their masks into L2, and launches with more masks
# run as row groups whose masks fit (docs/kernel.md, "Row groups whose masks fit in L2").
GROUP_MASK_BYTES = 16 << 20
PREFETCH_MIN_LOGITS_BYTES = 128 << 20
# Launches of 16-bit logits that fit in L2 take the chunked kernel that scatters -inf into mixed
# vectors instead of reading them (fp32 rows always do: see mask_logits.cu).
_SCATTER_KERNELS = {"mask_f16_v8": "mask_f16_v8_scatter", "mask_bf16_v8": "mask_bf16_v8_scatter"}
# The chunked kernels (mask_rows), the ones launched as row groups when their masks are many.
_CHUNKED_KERNELS = frozenset({*_KERNELS.values(), *_SCATTER_KERNELS.values()})
# The kernels whose launch follows a LaunchPlan, sampled from each step's masks.
_PLANNED_KERNELS = _CHUNKED_KERNELS | frozenset(_FLAT_SPARSE_KERNELS)
# The sparse plan's kernel for aligned rows (scan_rows): warps (up to _SCAN_WAVES times the blocks all
# SMs hold, scan_blocks) walk the launch's masks as one array, more words in flight per warp than mask_rows.
_SCAN_KERNELS = {
    "mask_f32_v4": "scan_f32_v4",
    "mask_f16_v8": "scan_f16_v8",
    "mask_f16_v8_scatter": "scan_f16_v8_scatter",
    "mask_bf16_v8": "scan_bf16_v8",
    "mask_bf16_v8_scatter": "scan_bf16_v8_scatter",
}
_SCAN_WAVES = 1.0
_SCAN_PIECE_WORDS = 64  # mask words a warp checks at once (SCAN_PIECE_WORDS in mask_logits.cu)
# Pieces of mask words a scan warp takes before the grid grows: one round of loads (docs/kernel.md,
# "The sparse kernel's grid").
SCAN_WARP_PIECES = 8
_SCAN_PATCHY_WARP_PIECES = 1
_SPARSE_LAYOUTS = frozenset({SPARSE, PATCHY})  # plans that, once resolved, take the sparse plan's kernels
# Steps whose sampled runs mostly, not all, allow everything (LaunchPlan.PATCHY): every constrained chunk its
# own warp up to these sizes (docs/kernel.md, "A few constrained rows: the patchy plan").
PATCHY_WORDS_MAX_BYTES = 128 << 20
PATCHY_DENSE_MAX_CHUNKS = 32768
_PATCHY_SCATTER_WAVES = 1.5
_PATCHY_WORDS_KERNELS = {**_WORDS_KERNELS, **{_SCATTER_KERNELS[name]: words for name, words in _WORDS_KERNELS.items()}}
_PATCHY_DENSE_KERNELS = frozenset({"mask_f32_v4"})
# The small-launch kernels, for the applier to look up their launch bounds.
FLAT_KERNELS = frozenset(_FLAT_SHAPES)
# The sparse plan's own kernels, whose resident blocks the device reports (DeviceFacts.scan_resident_blocks).
SCAN_KERNELS = frozenset(_SCAN_KERNELS.values())
# Every kernel a step may launch; the naive comparison kernels (NAIVE_KERNELS) only benchmarks launch.
SERVING_KERNELS = frozenset(
    {*_KERNELS.values(), *_SCATTER_KERNELS.values(), *_BY_WORD_KERNELS, *SCAN_KERNELS, *_FLAT_SHAPES}
)


class LaunchPlan(enum.Enum):
    """How a launch is laid out, chosen per step from a sample of its masks (all but the plain
    kernel's and the mid-size 16-bit launches', which have one layout)."""

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


def element_bytes(kernel: str) -> int:
    """Bytes per logit of a kernel, from its name."""
    return 4 if "f32" in kernel else 2


def patchy_launch(
    name: str,
    rows: int,
    vocab: int,
    *,
    scatter_max_rows: int,
    words_max_bytes: int = PATCHY_WORDS_MAX_BYTES,
    dense_max_chunks: int = PATCHY_DENSE_MAX_CHUNKS,
) -> tuple[str, str | None]:
    """The kernel and plan (None: the kernel has one layout) that a launch of kernel ``name`` over
    ``rows`` rows of ``vocab`` logits takes when its masks' sample finds it patchy
    (``scatter_max_rows``: the most rows a 16-bit small launch scatters into). PATCHY, for chunked
    launches past these sizes: the sparse plan's kernels, their warps spread one piece each."""
    if name in _FLAT_SHAPES:
        scatter = _FLAT_REFUSED_KERNELS.get(name)
        if scatter is None:  # (fp32: the kernel scatters already)
            return name, DENSE
        return (scatter, DENSE) if rows <= scatter_max_rows else (name, SPARSE)
    words = _PATCHY_WORDS_KERNELS.get(name)
    if words is not None and rows * vocab * element_bytes(name) <= words_max_bytes:
        return words, None
    chunks = (vocab + _LOGITS_PER_WARP - 1) // _LOGITS_PER_WARP
    if name in _PATCHY_DENSE_KERNELS and rows * chunks <= dense_max_chunks:
        return name, DENSE
    return name, PATCHY


@dataclass(frozen=True)
class DeviceFacts:
    """What the policy needs to know of the GPU: its SMs, its L2, and how many blocks of each scan
    kernel all SMs hold at once (the driver's occupancy, at ``PolicySettings.chunk_threads``)."""

    sms: int
    l2_bytes: int
    scan_resident_blocks: Mapping[str, int]


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

    kernel: str
    blocks: int
    rows: int
    threads: int
    plan: LaunchPlan | None
    prefetch: bool = False
    groups: tuple[tuple[int, int], ...] = field(default=())


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
        self._patchy_scatter_max_rows = self.flat_rows_within("flat_bf16_v8_scatter", _PATCHY_SCATTER_WAVES)
        self._forced_plan: str | None = None if settings.plan is None else settings.plan.value
        group_mask_bytes = settings.group_mask_bytes
        self._group_rows = sys.maxsize if group_mask_bytes is None else max(1, group_mask_bytes // (self.words * 4))
        # The kernels whose launches have a refused plan: (sampled runs that must allow nothing, and
        # the rows, above the first and up to the second, of the launches that have it). 16-bit small
        # launches of any size; fp32 two-vector small ones whose one-vector grid takes one wave to
        # _FLAT_ONE_REFUSED_WAVES (none when flat_per_thread is forced); mid-size fp32 ones up to the
        # mid-size bound.
        one_refused = (
            (self.flat_rows_within("flat_f32_v4", 1.0), self.flat_rows_within("flat_f32_v4", _FLAT_ONE_REFUSED_WAVES))
            if settings.flat_per_thread is None
            else (0, 0)
        )
        self._refusals: dict[str, tuple[int, int, int]] = {
            **dict.fromkeys(_FLAT_REFUSED_KERNELS, (REFUSED_FROM, 0, sys.maxsize)),
            **dict.fromkeys(_FLAT_ONE_REFUSED_KERNELS, (REFUSED_FROM, *one_refused)),
            **dict.fromkeys(_MID_REFUSED_KERNELS, (MID_REFUSED_FROM, 0, settings.words_max_bytes // (vocab_size * 4))),
        }
        scatter16 = settings.scatter16_max_bytes
        self._scatter16_max_bytes = device.l2_bytes if scatter16 is None else scatter16
        self._launches: dict[tuple[str, int, str | None, bool], Launch] = {}

    # The step's kernel and plan ----------------------------------------------------------------

    def kernel(self, dtype: torch.dtype, aligned: bool, naive: bool, rows: int) -> str:
        """The kernel for ``rows`` rows of ``dtype`` logits (``aligned``: every row starts on 16 bytes),
        before its plan resolves it."""
        name = NAIVE_KERNELS.get(dtype) if naive else _KERNELS.get((dtype, aligned))
        if name is None:
            raise ValueError(f"no mask kernel for {dtype}")
        logits_bytes = rows * self.vocab_size * dtype.itemsize
        if not naive and logits_bytes <= self.settings.flat_max_bytes and name in _FLAT_KERNELS:
            flat = _FLAT_KERNELS[name]
            two = _FLAT_TWO_PER_THREAD.get(flat)
            if two is not None and rows > self._flat_two_above_rows:
                return two
            return flat
        if not naive and logits_bytes <= self.settings.words_max_bytes:
            return _WORDS_KERNELS.get(name, name)
        if not naive and logits_bytes <= self._scatter16_max_bytes:
            return _SCATTER_KERNELS.get(name, name)
        return name

    def plan(self, name: str, rows: int, naive: bool, sample: Callable[[int, int | None], str]) -> str | None:
        """The plan (LaunchPlan's value) a chunked or small launch takes: the forced one, or what
        ``sample(rows, refused_from)`` reads from the step's masks (None for the other kernels; only
        16-bit small launches, fp32 ones of two vectors per thread in a band of sizes, and mid-size
        aligned fp32 ones take the refused plan)."""
        if naive or name not in _PLANNED_KERNELS:
            return None
        refusal = self._refusals.get(name)  # (None, or a size outside its rows: no refused plan)
        refused_from = refusal[0] if refusal is not None and refusal[1] < rows <= refusal[2] else None
        forced = self._forced_plan
        if forced is not None:
            return DENSE if forced == REFUSED and refused_from is None else forced
        return sample(rows, refused_from)  # (launch resolves PATCHY with patchy_launch)

    def launch(self, name: str, rows: int, naive: bool, plan: str | None, masks_back_to_back: bool = True) -> Launch:
        """The launch of kernel ``name`` over ``rows`` rows with ``plan`` (``masks_back_to_back``:
        row i's mask right after row i - 1's, as the applier lays them out)."""
        key = (name, rows, plan, masks_back_to_back)
        found = self._launches.get(key)
        if found is None:
            found = self._launches[key] = self._resolve(name, rows, naive, plan, masks_back_to_back)
        return found

    def _resolve(self, name: str, rows: int, naive: bool, plan: str | None, masks_back_to_back: bool) -> Launch:
        if plan == PATCHY:
            name, plan = patchy_launch(name, rows, self.vocab_size, scatter_max_rows=self._patchy_scatter_max_rows)
        if plan in _SPARSE_LAYOUTS:  # (PATCHY here: patchy_launch's large launches)
            if name in _SCAN_KERNELS and masks_back_to_back:
                name = _SCAN_KERNELS[name]
            elif name in _FLAT_SPARSE_KERNELS:
                name = _FLAT_SPARSE_KERNELS[name]
        elif plan == REFUSED:
            name = _REFUSED_KERNELS[name]
        grouped = plan == DENSE and rows > self._group_rows and name in _CHUNKED_KERNELS
        blocks, grid_rows, threads = self.grid(name, self._group_rows if grouped else rows, naive, plan)
        launch_plan = None if plan is None else LaunchPlan(plan)
        if grouped:
            groups = tuple(self.row_groups(rows))
            return Launch(name, blocks, grid_rows, threads, launch_plan, groups=groups)
        return Launch(name, blocks, grid_rows, threads, launch_plan, prefetch=self.prefetches(name, rows, plan))

    def row_groups(self, rows: int) -> list[tuple[int, int]]:
        """``(first row, rows)`` of each launch of a chunked step: consecutive groups of about equal
        size whose masks take at most ``group_mask_bytes`` (one group when they all do)."""
        groups = (rows + self._group_rows - 1) // self._group_rows
        size = (rows + groups - 1) // groups
        return [(first, min(size, rows - first)) for first in range(0, rows, size)]

    def prefetches(self, name: str, rows: int, plan: str | None) -> bool:
        """Whether a launch of ``rows`` rows prefetches its masks into L2 before its stores (dense plan)."""
        masks_fit = rows * self.words * 4 <= GROUP_MASK_BYTES
        large = self._logits_bytes(name, rows) > PREFETCH_MIN_LOGITS_BYTES
        return plan == DENSE and masks_fit and large

    def _logits_bytes(self, name: str, rows: int) -> int:
        """Bytes of logits a launch of kernel ``name`` over ``rows`` rows masks."""
        return rows * self.vocab_size * element_bytes(name)

    # Grids -------------------------------------------------------------------------------------

    def _flat_two_threshold(self, flat_per_thread: int | None) -> int:
        """Rows above which an fp32 small launch takes two vectors per thread: where one each would
        take most of a wave, or as ``flat_per_thread`` says."""
        if flat_per_thread not in (None, 1, 2):
            raise ValueError("flat_per_thread must be 1, 2 or None")
        if flat_per_thread is not None:
            return 0 if flat_per_thread == 2 else sys.maxsize
        return self.flat_rows_within("flat_f32_v4", _FLAT_TWO_FROM_WAVE)

    def flat_rows_within(self, name: str, waves: float) -> int:
        """The most rows a launch of small-launch kernel ``name`` takes with its grid in ``waves``
        waves of blocks."""
        return int(waves * self._flat_wave_blocks) // self.grid(name, 1, False)[0]

    def grid(self, name: str, rows: int, naive: bool, plan: str | None = None) -> tuple[int, int, int]:
        """Blocks in x and y (y is the row) and threads per block."""
        if name in _FLAT_SHAPES or name in _BY_WORD_KERNELS:  # a few vectors, or a mask word, per thread
            vector, per_thread = _FLAT_SHAPES.get(name, (32, 1))
            threads = self._flat_threads if name in _FLAT_SHAPES else THREADS_PER_BLOCK
            per_block = threads * vector * per_thread
            return (self.vocab_size + per_block - 1) // per_block, rows, threads
        if naive:
            blocks = max(1, min(64, (self.vocab_size + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK))
            return blocks, rows, THREADS_PER_BLOCK
        chunks = self._chunks
        threads = self._chunk_threads
        warps = threads // 32
        settings_waves = self.settings.waves
        resident_blocks = self.device.scan_resident_blocks.get(name)
        if resident_blocks is not None:  # resident warps over the launch's pieces of mask words
            waves = _SCAN_WAVES if settings_waves is None else settings_waves
            resident = max(1, int(resident_blocks * waves))
            pieces = (rows * self.words + _SCAN_PIECE_WORDS - 1) // _SCAN_PIECE_WORDS
            warp_pieces = _SCAN_PATCHY_WARP_PIECES if plan == PATCHY else self._scan_warp_pieces
            return scan_blocks(pieces, warps, resident, warp_pieces), 1, threads
        chunk_blocks = (chunks + warps - 1) // warps
        if settings_waves is not None:
            waves = settings_waves
        elif plan in _SPARSE_LAYOUTS:
            large = self._logits_bytes(name, rows) > _SPARSE_HALF_WAVE_MAX_BYTES
            waves = _SPARSE_WAVES_LARGE if large else _SPARSE_WAVES
        else:  # a warp per chunk
            return chunk_blocks, rows, threads
        blocks = max(1, min(chunk_blocks, (int(self._wave_blocks * waves) + rows - 1) // rows))
        return blocks, rows, threads
