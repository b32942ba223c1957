"""The GPU path of the logits post-processor: the bitmask kernel in ``mask_logits.cu``.

PyCUDA compiles the kernel (once per process and GPU architecture; it caches the cubin on disk)
and is imported lazily: it has no wheel and needs the CUDA toolkit, and CPU deployments never
touch it. Launching goes through the CUDA driver API (ctypes), because PyCUDA can launch only
on its own stream objects while the engine hands us a raw ``stream_ptr``:

- the module is loaded and its functions looked up once; the launch parameters live in ctypes
  holders prepared once, so a launch packs nothing in Python (a "prepared call");
- a step's row pointers and masks share one pinned host buffer (llguidance fills the masks in
  place; the pointers sit right before them) and go to the device in one asynchronous copy;
- the copy and the kernel are queued on the engine's own stream, so they are ordered after the
  forward pass that wrote the logits and before the sampler that reads them, without a sync;
- an event after the copy tells the next step when the pinned buffer may be rewritten;
- the copy, the event and the launch of a step shape (kernel, rows, row addressing, launch plan)
  seen before are replayed as one captured CUDA graph: one driver call per step instead of three;
- a launch's layout follows its masks: a sample of them, read on the host, tells steps that
  allow everything (the kernel only reads the masks) from steps that mostly do (a few rows
  constrained: every constrained chunk gets its own warp), from steps that make the kernel write
  and, for 16-bit small launches, from steps that allow almost nothing (no thread reads a logit
  it refuses; some fp32 ones take one vector per thread instead of two) (``LaunchPlan``);
- the device's primary context (the one torch and TensorRT-LLM use) is made current on the
  calling thread when it is not already.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from backend.kernels.mask_probe import DENSE, PATCHY, REFUSED, REFUSED_FROM, SPARSE, MaskDensityProbe

KERNEL_SOURCE = Path(__file__).with_name("mask_logits.cu")
THREADS_PER_BLOCK = 256
_LOGITS_PER_WARP = 1024
_CU_EVENT_DISABLE_TIMING = 2
_CU_EVENT_RECORD_EXTERNAL = 1  # an event recorded during capture becomes a node of the graph
_CU_STREAM_NON_BLOCKING = 1
_CU_STREAM_CAPTURE_MODE_RELAXED = 2  # capturing here leaves other threads' CUDA calls alone
_MAX_GRAPHS = 64  # captured step shapes kept (one per batch size in practice)
_MAX_SEEN = 4096  # shapes seen once, remembered to capture them when they come again
_CU_FUNC_ATTRIBUTE_NUM_REGS = 4
_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
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

_void_p = ctypes.c_void_p


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


# A step shape, whose launches are captured as one graph: kernel, rows, row base and stride, and
# the plan a chunked or small launch takes (LaunchPlan's value; None for the other kernels). (The
# value, not the enum: hashing an enum member runs Python code, and a step looks its shape up.)
_Shape = tuple[str, int, int, int, str | None]


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


def _element_bytes(kernel: str) -> int:
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
    if words is not None and rows * vocab * _element_bytes(name) <= words_max_bytes:
        return words, None
    chunks = (vocab + _LOGITS_PER_WARP - 1) // _LOGITS_PER_WARP
    if name in _PATCHY_DENSE_KERNELS and rows * chunks <= dense_max_chunks:
        return name, DENSE
    return name, PATCHY


class _Driver:
    """The few CUDA driver calls the applier makes, with their argument types declared."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        signatures: dict[str, list[type]] = {
            "cuCtxGetCurrent": [ctypes.POINTER(_void_p)],
            "cuCtxPushCurrent_v2": [_void_p],
            "cuCtxPopCurrent_v2": [ctypes.POINTER(_void_p)],
            "cuModuleLoadData": [ctypes.POINTER(_void_p), ctypes.c_char_p],
            "cuModuleGetFunction": [ctypes.POINTER(_void_p), _void_p, ctypes.c_char_p],
            "cuLaunchKernel": [_void_p] + [ctypes.c_uint] * 7 + [_void_p, ctypes.POINTER(_void_p), _void_p],
            "cuMemcpyHtoDAsync_v2": [ctypes.c_uint64, _void_p, ctypes.c_size_t, _void_p],
            "cuEventCreate": [ctypes.POINTER(_void_p), ctypes.c_uint],
            "cuEventRecord": [_void_p, _void_p],
            "cuEventRecordWithFlags": [_void_p, _void_p, ctypes.c_uint],
            "cuStreamCreate": [ctypes.POINTER(_void_p), ctypes.c_uint],
            "cuStreamBeginCapture_v2": [_void_p, ctypes.c_int],
            "cuStreamEndCapture": [_void_p, ctypes.POINTER(_void_p)],
            "cuGraphInstantiateWithFlags": [ctypes.POINTER(_void_p), _void_p, ctypes.c_ulonglong],
            "cuGraphLaunch": [_void_p, _void_p],
            "cuGraphExecDestroy": [_void_p],
            "cuGraphDestroy": [_void_p],
            "cuEventSynchronize": [_void_p],
            "cuFuncGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, _void_p],
            "cuOccupancyMaxActiveBlocksPerMultiprocessor": [
                ctypes.POINTER(ctypes.c_int),
                _void_p,
                ctypes.c_int,
                ctypes.c_size_t,
            ],
        }
        for name, argtypes in signatures.items():
            getattr(lib, name).argtypes = argtypes
        self.lib = lib

    @staticmethod
    def check(result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} failed with CUDA driver error {result}")

    def current_context(self) -> int | None:
        context = _void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        return context.value


class CudaBitmaskApplier:
    """Applies int32 ``[rows, words]`` bitmasks to logits rows on one CUDA device."""

    def __init__(
        self,
        device: torch.device,
        max_rows: int,
        vocab_size: int,
        *,
        waves: float | None = None,
        defines: Sequence[str] = (),
        graphs: bool = True,
        flat_max_bytes: int = FLAT_MAX_BYTES,
        chunk_threads: int = THREADS_PER_BLOCK,
        scatter16_max_bytes: int | None = None,
        words_max_bytes: int = WORDS_MAX_BYTES,
        flat_per_thread: int | None = None,
        group_mask_bytes: int | None = GROUP_MASK_BYTES,
        plan: LaunchPlan | None = None,
        flat_threads: int = THREADS_PER_BLOCK,
        scan_warp_pieces: int = SCAN_WARP_PIECES,
    ) -> None:
        """``waves`` (fixed, instead of by launch size), ``defines`` (``-D`` macros for the kernel
        source), ``graphs=False`` (three driver calls a step, never a captured graph),
        ``flat_max_bytes`` (the largest launch of one vector per thread), ``chunk_threads`` (threads
        per block of the chunked kernels, at most 256) and ``scatter16_max_bytes`` (the largest
        launch of 16-bit logits whose mixed vectors are scattered into; by default the size of the
        device's L2 cache), ``words_max_bytes`` (the largest 16-bit launch above
        ``flat_max_bytes`` of one warp per chunk, every chunk at once, and the largest aligned
        fp32 one that takes the refused plan), ``flat_per_thread``
        (vectors per thread of the fp32 small-launch kernel, 1 or 2, instead of by launch
        size), ``group_mask_bytes`` (chunked launches whose masks exceed it run as dense-plan row
        groups whose masks fit, one launch each; None: never), ``plan`` (every chunked or small
        launch laid out so, instead of by its masks; the launches that have no refused plan take
        the dense one for it) and ``flat_threads`` (threads per block of the small-launch kernels, a
        multiple of 32, at most their launch bounds: 256 unless built with ``LLGT_FLAT_BOUNDS``) and
        ``scan_warp_pieces`` (pieces of mask words each warp of the sparse plan's kernel takes
        before its grid grows) exist for the benchmark's comparisons and the tests."""
        import pycuda.driver as cuda
        from pycuda.compiler import compile as compile_cuda

        self._cuda = cuda
        cuda.init()
        index = device.index if device.index is not None else torch.cuda.current_device()
        pycuda_device = cuda.Device(index)
        self._context = pycuda_device.retain_primary_context()
        self._driver = _Driver()
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._chunks = (vocab_size + _LOGITS_PER_WARP - 1) // _LOGITS_PER_WARP
        self._sms = int(pycuda_device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))
        self._chunk_threads = chunk_threads
        self._wave_blocks: int = self._sms * (2048 // chunk_threads)
        self._flat_threads = _checked_flat_threads(flat_threads)
        self._flat_wave_blocks = self._sms * (2048 // flat_threads)  # (flat_f32_v4's registers allow it)
        self._flat_two_above_rows = self._flat_two_threshold(flat_per_thread)
        # (patchy 16-bit small launches scatter while their grid fits in _PATCHY_SCATTER_WAVES waves)
        self._patchy_scatter_max_rows = self._flat_rows_within("flat_bf16_v8_scatter", _PATCHY_SCATTER_WAVES)
        self._waves = waves
        self._scan_warp_pieces = _checked_scan_warp_pieces(scan_warp_pieces)
        self._forced_plan: str | None = None if plan is None else plan.value
        self._group_rows = sys.maxsize if group_mask_bytes is None else max(1, group_mask_bytes // (self.words * 4))
        self._flat_max_bytes = flat_max_bytes
        self._words_max_bytes = words_max_bytes
        # The kernels whose launches have a refused plan: (sampled runs that must allow nothing, and
        # the rows, above the first and up to the second, of the launches that have it). 16-bit small
        # launches of any size; fp32 two-vector small ones whose one-vector grid takes one wave to
        # _FLAT_ONE_REFUSED_WAVES (none when flat_per_thread is forced); mid-size fp32 ones up to the
        # mid-size bound.
        one_refused = (
            (self._flat_rows_within("flat_f32_v4", 1.0), self._flat_rows_within("flat_f32_v4", _FLAT_ONE_REFUSED_WAVES))
            if flat_per_thread is None
            else (0, 0)
        )
        self._refusals: dict[str, tuple[int, int, int]] = {
            **dict.fromkeys(_FLAT_REFUSED_KERNELS, (REFUSED_FROM, 0, sys.maxsize)),
            **dict.fromkeys(_FLAT_ONE_REFUSED_KERNELS, (REFUSED_FROM, *one_refused)),
            **dict.fromkeys(_MID_REFUSED_KERNELS, (MID_REFUSED_FROM, 0, words_max_bytes // (vocab_size * 4))),
        }
        l2_bytes = int(pycuda_device.get_attribute(cuda.device_attribute.L2_CACHE_SIZE))
        self._scatter16_max_bytes = l2_bytes if scatter16_max_bytes is None else scatter16_max_bytes
        self._context.push()
        try:
            self._primary = self._driver.current_context()
            major, minor = pycuda_device.compute_capability()
            cubin = compile_cuda(
                KERNEL_SOURCE.read_text(),
                no_extern_c=True,
                options=["-O3", *(f"-D{define}" for define in defines)],
                arch=f"sm_{major}{minor}",
            )
            self._functions = self._load(cubin)
            self._copied = _void_p()
            result = self._driver.lib.cuEventCreate(ctypes.byref(self._copied), _CU_EVENT_DISABLE_TIMING)
            self._driver.check(result, "cuEventCreate")
            self._capture_stream = _void_p()
            result = self._driver.lib.cuStreamCreate(ctypes.byref(self._capture_stream), _CU_STREAM_NON_BLOCKING)
            self._driver.check(result, "cuStreamCreate")
            self._use_graphs = graphs
            self._graphs: dict[_Shape, _void_p] = {}
            self._seen: set[_Shape] = set()
            self._allocate(max_rows)
        finally:
            cuda.Context.pop()
        self._prepare_steps()

    def _prepare_steps(self) -> None:
        """The per-step calls, looked up once (each attribute lookup costs host time on the hot path),
        and the per-step state."""
        lib = self._driver.lib
        self._get_current, self._memcpy, self._record = lib.cuCtxGetCurrent, lib.cuMemcpyHtoDAsync_v2, lib.cuEventRecord
        self._launch_kernel, self._launch_graph = lib.cuLaunchKernel, lib.cuGraphLaunch
        self._current_holder = _void_p()
        self._current_ref = ctypes.byref(self._current_holder)
        self._grids: dict[tuple[str, int, str | None], tuple[int, int, int]] = {}
        self._primary_threads: set[int] = set()
        self._row_base, self._row_stride = 0, 0  # uniform rows: base + row * stride; stride 0: the array
        self._last_tensor: tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype] | None = None
        self._last_kernel = ""
        self._last_rows = 0

    def _load(self, cubin: bytes) -> dict[str, _void_p]:
        """Load the compiled module (kept: its functions live as long as it does); look its kernels up."""
        module = _void_p()
        self._driver.check(self._driver.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        self._module = module
        functions = {}
        names = {
            *_KERNELS.values(),
            *NAIVE_KERNELS.values(),
            *_SCATTER_KERNELS.values(),
            *_BY_WORD_KERNELS,
            *_SCAN_KERNELS.values(),
        }
        for name in sorted(names | set(_FLAT_SHAPES)):
            function = _void_p()
            result = self._driver.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode())
            self._driver.check(result, "cuModuleGetFunction")
            functions[name] = function
        self._resident_blocks: dict[str, int] = {}  # blocks of each scan kernel all SMs hold at once
        for name in _SCAN_KERNELS.values():
            per_sm = ctypes.c_int()
            result = self._driver.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(per_sm), functions[name], self._chunk_threads, 0
            )
            self._driver.check(result, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            self._resident_blocks[name] = max(1, per_sm.value) * self._sms
        flat = {name: functions[name] for name in _FLAT_SHAPES}
        bound = min(self._attribute(flat, _CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).values())
        if self._flat_threads > bound:
            raise ValueError(
                f"flat_threads={self._flat_threads}: this build's small-launch kernels take at most {bound}"
                " threads a block (raise LLGT_FLAT_BOUNDS)"
            )
        return functions

    def registers(self) -> dict[str, int]:
        """Registers per thread of each kernel (they bound how many blocks an SM holds at once)."""
        return self._attribute(self._functions, _CU_FUNC_ATTRIBUTE_NUM_REGS)

    def _attribute(self, functions: dict[str, _void_p], attribute: int) -> dict[str, int]:
        values = {}
        for name, function in functions.items():
            value = ctypes.c_int()
            result = self._driver.lib.cuFuncGetAttribute(ctypes.byref(value), attribute, function)
            self._driver.check(result, "cuFuncGetAttribute")
            values[name] = value.value
        return values

    # Buffers ----------------------------------------------------------------------------------

    def _allocate(self, rows: int) -> None:
        cuda = self._cuda
        self._max_rows = rows
        self._pointer_bytes = rows * 8
        size = self._pointer_bytes + rows * self.words * 4
        self._host = cuda.pagelocked_empty(size, dtype=np.uint8)
        self._host_address = int(self._host.ctypes.data)
        self._device_buffer = cuda.mem_alloc(size)
        self._device_address = int(self._device_buffer)
        self._pointers = self._host[: self._pointer_bytes].view(np.uint64)
        masks = self._host[self._pointer_bytes :].view(np.int32)
        self._masks = torch.from_numpy(masks.reshape(rows, self.words))
        self._probe = MaskDensityProbe(masks, self.words)
        # The launch parameters: (rows pointer array, base, row stride in elements (0: use the array),
        # masks pointer, mask stride, mask words, vocab, prefetch the masks into L2 first, rows: read
        # by the scan kernels, whose grid is not one row per blockIdx.y).
        self._param_rows = ctypes.c_uint64(0)
        self._param_base = ctypes.c_uint64(0)
        self._param_row_stride = ctypes.c_longlong(0)
        self._param_masks = ctypes.c_uint64(self._device_address + self._pointer_bytes)
        self._param_ints = (ctypes.c_int(self.words), ctypes.c_int(self.words), ctypes.c_int(self.vocab_size))
        self._param_prefetch = ctypes.c_int(0)
        self._param_row_count = ctypes.c_int(0)
        holders = (
            self._param_rows,
            self._param_base,
            self._param_row_stride,
            self._param_masks,
            *self._param_ints,
            self._param_prefetch,
            self._param_row_count,
        )
        self._params = (_void_p * len(holders))(*(ctypes.cast(ctypes.pointer(h), _void_p) for h in holders))
        self._last_tensor = None
        self._drop_graphs()  # they copy from and point into the old buffers

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """The primary context current on this thread; usually it already is (one driver call)."""
        if self._driver.current_context() == self._primary:
            yield
            return
        self._driver.check(self._driver.lib.cuCtxPushCurrent_v2(self._primary), "cuCtxPushCurrent")
        try:
            yield
        finally:
            self._driver.lib.cuCtxPopCurrent_v2(ctypes.byref(_void_p()))

    def host_masks(self, rows: int) -> torch.Tensor:
        """The pinned int32 ``[rows, words]`` buffer for the next step's masks (fill it, then ``apply``)."""
        with self._current():
            # The previous step's copy must have left the buffer before it is rewritten.
            self._driver.check(self._driver.lib.cuEventSynchronize(self._copied), "cuEventSynchronize")
            if rows > self._max_rows:
                self._context.push()
                try:
                    self._allocate(rows)
                finally:
                    self._cuda.Context.pop()
        return self._masks[:rows]

    def launch_plan(self, logits: Sequence[torch.Tensor] | torch.Tensor) -> LaunchPlan | None:
        """The plan ``apply(logits, ...)`` would lay its launch out by, from a sample of the masks now
        in ``host_masks`` (None: that launch has one layout)."""
        name, rows = self._set_pointers(logits, naive=False, check_only=True)
        plan = self._plan(name, rows, naive=False) if rows else None
        return None if plan is None else LaunchPlan(plan)

    # Launching --------------------------------------------------------------------------------

    def apply(self, logits: Sequence[torch.Tensor] | torch.Tensor, stream_ptr: int, *, naive: bool = False) -> None:
        """Mask row ``i`` of ``logits`` with row ``i`` of ``host_masks``, queued on ``stream_ptr``.

        ``logits`` is a sequence of tensors ending in ``vocab`` (TensorRT-LLM's per-request views)
        or one tensor ``[..., vocab]`` whose leading dimensions are the rows.
        """
        name, rows = self._set_pointers(logits, naive)
        if rows == 0:
            return
        if threading.get_ident() in self._primary_threads:
            self._queue(name, rows, stream_ptr, naive)
            return
        # First call on this thread: is the primary context current (it is on threads that ran CUDA
        # work: torch's, TensorRT-LLM's)? Then remember the thread and skip this check from now on.
        # (Were another context made current later, the launch would fail loudly, not mask wrongly.)
        self._get_current(self._current_ref)
        if self._current_holder.value == self._primary:
            self._primary_threads.add(threading.get_ident())
            self._queue(name, rows, stream_ptr, naive)
        else:
            with self._current():
                self._queue(name, rows, stream_ptr, naive)

    def _queue(self, name: str, rows: int, stream_ptr: int, naive: bool) -> None:
        """The step's copy, event and launch: a graph replay when this shape was seen before."""
        plan = self._plan(name, rows, naive)
        shape = (name, rows, self._row_base, self._row_stride, plan)
        graph = self._graphs.get(shape)
        if graph is None and self._use_graphs and shape in self._seen:
            graph = self._capture(shape, naive)
        if graph is not None:
            if self._launch_graph(graph, stream_ptr):
                raise RuntimeError("cuGraphLaunch failed")
            return
        # A shape seen once is remembered, not captured: a caller whose logits move every step
        # (a new tensor each time) would otherwise pay for a capture every step.
        if len(self._seen) >= _MAX_SEEN:
            self._seen.clear()
        self._seen.add(shape)
        self._enqueue(name, rows, stream_ptr, naive, plan)

    def _plan(self, name: str, rows: int, naive: bool) -> str | None:
        """The plan (LaunchPlan's value) a chunked or small launch takes, from a sample of this step's
        masks (None for the other kernels; only 16-bit small launches, fp32 ones of two vectors per
        thread in a band of sizes, and mid-size aligned fp32 ones take the refused plan)."""
        if naive or name not in _PLANNED_KERNELS:
            return None
        refusal = self._refusals.get(name)  # (None, or a size outside its rows: no refused plan)
        refused_from = refusal[0] if refusal is not None and refusal[1] < rows <= refusal[2] else None
        forced = self._forced_plan
        if forced is not None:
            return DENSE if forced == REFUSED and refused_from is None else forced
        return self._probe.plan(rows, refused_from)  # (_launch resolves PATCHY with patchy_launch)

    def _enqueue(
        self, name: str, rows: int, stream_ptr: int, naive: bool, plan: str | None, *, capturing: bool = False
    ) -> None:
        if self._memcpy(*self._step_copy(rows), stream_ptr):
            raise RuntimeError("cuMemcpyHtoDAsync failed")
        if capturing:
            result = self._driver.lib.cuEventRecordWithFlags(self._copied, stream_ptr, _CU_EVENT_RECORD_EXTERNAL)
        else:
            result = self._record(self._copied, stream_ptr)
        if result:
            raise RuntimeError(f"cuEventRecord failed with CUDA driver error {result}")
        self._launch(name, rows, stream_ptr, naive, plan)

    def _pointers_offset(self, rows: int) -> int:
        """Byte offset, in the pinned buffer and its device copy, of the first of ``rows`` row
        pointers: a step's pointers end where the masks begin, so one copy carries both."""
        return self._pointer_bytes - rows * 8

    def _step_copy(self, rows: int) -> tuple[int, int, int]:
        """Device address, host address and bytes of a step's one copy: the rows' pointers, which sit
        right before the masks in the pinned buffer, and their masks."""
        start = self._pointers_offset(rows)
        return (
            self._device_address + start,
            self._host_address + start,
            self._pointer_bytes + rows * self.words * 4 - start,
        )

    def _capture(self, shape: _Shape, naive: bool) -> _void_p:
        """Capture the step for ``shape`` (copy, event, launch with today's parameters) as a graph."""
        name, rows, _, _, plan = shape
        executable = self._capture_graph(
            lambda stream_ptr: self._enqueue(name, rows, stream_ptr, naive, plan, capturing=True)
        )
        if len(self._graphs) >= _MAX_GRAPHS:  # the oldest shape goes (freed once it has run)
            self._driver.lib.cuGraphExecDestroy(self._graphs.pop(next(iter(self._graphs))))
        self._graphs[shape] = executable
        return executable

    def _capture_graph(self, enqueue: Callable[[int], None]) -> _void_p:
        """An executable graph of what ``enqueue(stream_ptr)`` queues, captured on the capture stream
        (an event it records must be recorded with _CU_EVENT_RECORD_EXTERNAL to become a node)."""
        lib, stream = self._driver.lib, self._capture_stream
        self._driver.check(lib.cuStreamBeginCapture_v2(stream, _CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
        graph = _void_p()
        try:
            enqueue(stream.value or 0)
        finally:  # end the capture even when a call failed, so the stream stays usable
            ended = lib.cuStreamEndCapture(stream, ctypes.byref(graph))
        self._driver.check(ended, "cuStreamEndCapture")
        executable = _void_p()
        try:
            result = lib.cuGraphInstantiateWithFlags(ctypes.byref(executable), graph, 0)
            self._driver.check(result, "cuGraphInstantiate")
        finally:
            lib.cuGraphDestroy(graph)  # the executable graph keeps what it needs
        return executable

    def _drop_graphs(self) -> None:
        for executable in self._graphs.values():
            self._driver.lib.cuGraphExecDestroy(executable)
        self._graphs.clear()
        self._seen.clear()

    @property
    def captured_shapes(self) -> int:
        """How many step shapes are replayed as graphs (for tests and the benchmark)."""
        return len(self._graphs)

    def run_resident(
        self,
        logits: Sequence[torch.Tensor] | torch.Tensor,
        stream_ptr: int,
        *,
        naive: bool = False,
        mask_stride: int | None = None,
    ) -> None:
        """The kernel alone, on the pointers and masks already on the device (for benchmarks).

        ``mask_stride=0`` makes every row read row 0's mask, so the masks stay in L2: what the
        launch costs when reading them adds no DRAM traffic (a benchmark diagnostic).
        """
        name, rows = self._set_pointers(logits, naive, check_only=True)
        stride = self._param_ints[0]
        saved = stride.value
        if mask_stride is not None:
            stride.value = mask_stride
        try:
            with self._current():
                self._launch(name, rows, stream_ptr, naive, self._plan(name, rows, naive))
        finally:
            stride.value = saved

    def _launch(self, name: str, rows: int, stream_ptr: int, naive: bool, plan: str | None) -> None:
        if plan == PATCHY:
            name, plan = patchy_launch(name, rows, self.vocab_size, scatter_max_rows=self._patchy_scatter_max_rows)
        if plan in _SPARSE_LAYOUTS:  # (PATCHY here: patchy_launch's large launches)
            if name in _SCAN_KERNELS and self._param_ints[0].value == self.words:  # (masks back to back)
                name = _SCAN_KERNELS[name]
            elif name in _FLAT_SPARSE_KERNELS:
                name = _FLAT_SPARSE_KERNELS[name]
        elif plan == REFUSED:
            name = _REFUSED_KERNELS[name]
        grouped = plan == DENSE and rows > self._group_rows and name in _CHUNKED_KERNELS
        grid = self._grids.get((name, rows, plan))
        if grid is None:  # (row groups: the grid of a full group)
            grid = self._grid(name, self._group_rows if grouped else rows, naive, plan)
            self._grids[(name, rows, plan)] = grid
        self._param_rows.value = self._device_address + self._pointers_offset(rows)
        self._param_base.value, self._param_row_stride.value = self._row_base, self._row_stride
        if grouped:
            self._launch_groups(name, rows, grid, stream_ptr)
            return
        self._param_prefetch.value = self._prefetches(name, rows, plan)
        self._param_row_count.value = rows
        if self._launch_kernel(
            self._functions[name], grid[0], grid[1], 1, grid[2], 1, 1, 0, stream_ptr, self._params, None
        ):
            raise RuntimeError(f"cuLaunchKernel({name}) failed")

    def row_groups(self, rows: int) -> list[tuple[int, int]]:
        """``(first row, rows)`` of each launch of a chunked step: consecutive groups of about equal
        size whose masks take at most ``group_mask_bytes`` (one group when they all do)."""
        groups = (rows + self._group_rows - 1) // self._group_rows
        size = (rows + groups - 1) // groups
        return [(first, min(size, rows - first)) for first in range(0, rows, size)]

    def _launch_groups(self, name: str, rows: int, grid: tuple[int, int, int], stream_ptr: int) -> None:
        """One launch per row group with ``grid``'s blocks per row (the parameters are copied at each
        launch, so they are set anew for every group)."""
        element = _element_bytes(name)
        row_blocks, _, threads = grid
        rows_address, base, masks = self._param_rows.value, self._param_base.value, self._param_masks.value
        try:
            for first, count in self.row_groups(rows):
                self._param_rows.value = rows_address + first * 8
                self._param_base.value = base + first * self._row_stride * element
                self._param_masks.value = masks + first * self.words * 4
                self._param_prefetch.value = self._prefetches(name, count, DENSE)
                if self._launch_kernel(
                    self._functions[name], row_blocks, count, 1, threads, 1, 1, 0, stream_ptr, self._params, None
                ):
                    raise RuntimeError(f"cuLaunchKernel({name}) failed")
        finally:
            self._param_masks.value = masks

    def _prefetches(self, name: str, rows: int, plan: str | None) -> int:
        """1 when a launch of ``rows`` rows prefetches its masks into L2 before its stores (dense plan)."""
        masks_fit = rows * self.words * 4 <= GROUP_MASK_BYTES
        large = self._logits_bytes(name, rows) > PREFETCH_MIN_LOGITS_BYTES
        return int(plan == DENSE and masks_fit and large)

    def _logits_bytes(self, name: str, rows: int) -> int:
        """Bytes of logits a launch of kernel ``name`` over ``rows`` rows masks."""
        return rows * self.vocab_size * _element_bytes(name)

    def _flat_two_threshold(self, flat_per_thread: int | None) -> int:
        """Rows above which an fp32 small launch takes two vectors per thread: where one each would
        take most of a wave (worked out once, so a step only compares), or as ``flat_per_thread`` says."""
        if flat_per_thread not in (None, 1, 2):
            raise ValueError("flat_per_thread must be 1, 2 or None")
        if flat_per_thread is not None:
            return 0 if flat_per_thread == 2 else sys.maxsize
        return self._flat_rows_within("flat_f32_v4", _FLAT_TWO_FROM_WAVE)

    def _flat_rows_within(self, name: str, waves: float) -> int:
        """The most rows a launch of small-launch kernel ``name`` takes with its grid in ``waves``
        waves of blocks (worked out once, so a step only compares)."""
        return int(waves * self._flat_wave_blocks) // self._grid(name, 1, False)[0]

    def _grid(self, name: str, rows: int, naive: bool, plan: str | None = None) -> tuple[int, int, int]:
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
        if name in self._resident_blocks:  # resident warps over the launch's pieces of mask words
            waves = _SCAN_WAVES if self._waves is None else self._waves
            resident = max(1, int(self._resident_blocks[name] * waves))
            pieces = (rows * self.words + _SCAN_PIECE_WORDS - 1) // _SCAN_PIECE_WORDS
            warp_pieces = _SCAN_PATCHY_WARP_PIECES if plan == PATCHY else self._scan_warp_pieces
            return scan_blocks(pieces, warps, resident, warp_pieces), 1, threads
        chunk_blocks = (chunks + warps - 1) // warps
        if self._waves is not None:
            waves = self._waves
        elif plan in _SPARSE_LAYOUTS:
            large = self._logits_bytes(name, rows) > _SPARSE_HALF_WAVE_MAX_BYTES
            waves = _SPARSE_WAVES_LARGE if large else _SPARSE_WAVES
        else:  # a warp per chunk
            return chunk_blocks, rows, threads
        blocks = max(1, min(chunk_blocks, (int(self._wave_blocks * waves) + rows - 1) // rows))
        return blocks, rows, threads

    def _set_pointers(
        self, logits: Sequence[torch.Tensor] | torch.Tensor, naive: bool, check_only: bool = False
    ) -> tuple[str, int]:
        """Write the rows' addresses into the pinned buffer; return the kernel to use and the row count."""
        if isinstance(logits, torch.Tensor):
            key = (logits.data_ptr(), logits.shape, logits.stride(), logits.dtype)
            if key == self._last_tensor and not naive:
                return self._last_kernel, self._last_rows  # the same buffer as last step: pointers in place
            name, rows = self._tensor_pointers(logits, naive, check_only)
            self._last_tensor, self._last_kernel = (None, "") if (naive or check_only) else (key, name)
            self._last_rows = rows
            return name, rows
        self._last_tensor = None
        self._row_base, self._row_stride = 0, 0
        rows = len(logits)
        if rows == 0:
            return "", 0
        if rows > self._max_rows:
            raise ValueError(f"{rows} rows; call host_masks({rows}) first")
        pointers = self._request_pointers(logits)
        if not check_only:
            self._pointers[self._max_rows - rows :] = pointers
        aligned = not any(pointer & 15 for pointer in pointers)
        return self._kernel(logits[0].dtype, aligned, naive, rows), rows

    def _request_pointers(self, rows: Sequence[torch.Tensor]) -> list[int]:
        """The address of each request's row, after checking that every tensor is one row of the
        vocabulary's logits, contiguous, on the GPU, all of one dtype and shape.

        The engines hand one tensor per request, so this runs per row on every step: the first
        row's shape is checked once, the others are compared with it (one attribute each, not two),
        in the loop that collects the addresses. A tensor of several rows ([1, beams, vocab]) is
        refused: it has one mask, and only its first row would be masked.
        """
        first = rows[0]
        shape, dtype, vocab = first.shape, first.dtype, self.vocab_size
        if shape[-1] != vocab or first.numel() != vocab:
            raise ValueError(f"logits row 0 must be one row of {vocab} logits ([..., {vocab}]), not {list(shape)}")
        pointers = []
        for index, row in enumerate(rows):
            # (A one-row tensor is contiguous exactly when its last stride is 1.)
            if row.shape != shape or row.dtype != dtype or not row.is_contiguous() or not row.is_cuda:
                raise ValueError(
                    f"logits row {index} must be a CUDA tensor {list(shape)} of {dtype} with unit stride,"
                    f" like row 0; it is {list(row.shape)} of {row.dtype} on {row.device}, strides {row.stride()}"
                )
            pointers.append(row.data_ptr())
        return pointers

    def _tensor_pointers(self, logits: torch.Tensor, naive: bool, check_only: bool) -> tuple[str, int]:
        self._check_tensor(logits)
        # Row addresses from the strides: [batch, beams, vocab_padded][..., :vocab] views need no copy.
        offsets = np.zeros(1, dtype=np.int64)
        for size, stride in zip(logits.shape[:-1], logits.stride()[:-1], strict=True):
            offsets = (offsets[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).reshape(-1)
        rows, item, start = len(offsets), logits.element_size(), logits.data_ptr()
        if rows == 0:
            return "", 0
        if rows > self._max_rows:
            raise ValueError(f"{rows} rows; call host_masks({rows}) first")
        strides = [s for size, s in zip(logits.shape[:-1], logits.stride()[:-1], strict=True) if size > 1]
        aligned = start % 16 == 0 and all(s * item % 16 == 0 for s in strides)
        if not check_only:
            self._pointers[self._max_rows - rows :] = (offsets * item + start).astype(np.uint64)
        steps = np.diff(offsets)
        if rows == 1 or (steps[0] > 0 and bool(np.all(steps == steps[0]))):
            # Evenly spaced rows: the kernel computes addresses instead of loading them.
            self._row_base, self._row_stride = start, int(steps[0]) if rows > 1 else self.vocab_size
        else:
            self._row_base, self._row_stride = 0, 0
        return self._kernel(logits.dtype, aligned, naive, rows), rows

    def _check_tensor(self, logits: torch.Tensor) -> None:
        """Refuse a tensor the kernel would mask wrongly or write past."""
        vocab = self.vocab_size
        if logits.shape[-1] != vocab or logits.stride(-1) != 1 or not logits.is_cuda:
            raise ValueError(f"logits must be a CUDA tensor [..., {vocab}] with unit stride, not {list(logits.shape)}")

    def _kernel(self, dtype: torch.dtype, aligned: bool, naive: bool, rows: int) -> str:
        name = NAIVE_KERNELS.get(dtype) if naive else _KERNELS.get((dtype, aligned))
        if name is None:
            raise ValueError(f"no mask kernel for {dtype}")
        logits_bytes = rows * self.vocab_size * dtype.itemsize
        if not naive and logits_bytes <= self._flat_max_bytes and name in _FLAT_KERNELS:
            flat = _FLAT_KERNELS[name]
            two = _FLAT_TWO_PER_THREAD.get(flat)
            if two is not None and rows > self._flat_two_above_rows:
                return two
            return flat
        if not naive and logits_bytes <= self._words_max_bytes:
            return _WORDS_KERNELS.get(name, name)
        if not naive and logits_bytes <= self._scatter16_max_bytes:
            return _SCATTER_KERNELS.get(name, name)
        return name
