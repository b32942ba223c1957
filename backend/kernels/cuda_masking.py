"""The GPU path of the logits post-processor: the bitmask kernel in ``mask_logits.cu``.

PyCUDA compiles the kernel (once per process and GPU architecture; the cubin is cached on disk)
and is imported lazily: CPU deployments never touch it. Launches go through the CUDA driver API
(ctypes), as PyCUDA launches only on its own streams and the engine hands us a raw ``stream_ptr``.
A step's row pointers and masks share one pinned buffer (llguidance fills the masks in place), go
to the device in one asynchronous copy on the engine's stream, and a step shape seen before is
replayed as one captured CUDA graph; ``docs/kernel.md`` says why each part is so. The launch comes
from :mod:`backend.kernels.launch_policy`, its plan from a sample of the masks
(:mod:`backend.kernels.mask_probe`).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from backend.kernels.catalog import FLAT_KERNELS, KERNELS, SCAN_KERNELS, Kernel
from backend.kernels.cuda_pressure import PressureKernel
from backend.kernels.driver import (
    CU_EVENT_DISABLE_TIMING,
    CU_EVENT_RECORD_EXTERNAL,
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    CU_FUNC_ATTRIBUTE_NUM_REGS,
    CU_STREAM_CAPTURE_MODE_RELAXED,
    CU_STREAM_NON_BLOCKING,
    Driver,
)
from backend.kernels.launch_policy import DeviceFacts, Launch, LaunchPlan, LaunchPolicy, PolicySettings
from backend.kernels.mask_probe import DENSE, MaskDensityProbe
from backend.kernels.row_addresses import request_rows, tensor_rows
from backend.shared_masks import SharedMasks, shared_bytes

KERNEL_SOURCE = Path(__file__).with_name("mask_logits.cu")
_MAX_GRAPHS = 64  # captured step shapes kept (one per batch size in practice)
_MAX_SEEN = 4096  # shapes seen once, remembered to capture them when they come again
_void_p = ctypes.c_void_p


# A step shape, captured as one graph: kernel, rows, row base and stride, the plan (LaunchPlan's
# value, not the enum, whose hash runs Python; None for kernels without plans), pressure reduced or not.
_Shape = tuple[Kernel, int, int, int, str | None, bool]
# A tensor's rows as a step hands them: address, shape, strides, dtype, the rows chosen (None: all).
_TensorKey = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype, tuple[int, ...] | None]


class CudaBitmaskApplier:
    """Applies int32 ``[rows, words]`` bitmasks to logits rows on one CUDA device."""

    def __init__(
        self,
        device: torch.device,
        max_rows: int,
        vocab_size: int,
        *,
        settings: PolicySettings | None = None,
        defines: Sequence[str] = (),
        graphs: bool = True,
        shared: bool = False,
    ) -> None:
        """``shared``: the pinned host buffer is memory a mask process maps too, which writes the masks
        there itself (see ``backend.shared_masks``). ``settings`` (the launch policy's,
        :class:`PolicySettings`; the defaults are the measured best), ``defines`` (``-D`` macros for the
        kernel source) and ``graphs=False`` (three driver calls a step, never a captured graph) exist
        for the benchmark's comparisons and the tests."""
        import pycuda.driver as cuda
        from pycuda.compiler import compile as compile_cuda

        settings = settings or PolicySettings()
        self._cuda = cuda
        self._share = shared
        self._shared: SharedMasks | None = None
        cuda.init()
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._device = torch.device("cuda", index)
        pycuda_device = cuda.Device(index)
        self._context = pycuda_device.retain_primary_context()
        self._driver = Driver()
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._sms = int(pycuda_device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))
        self._l2_bytes = int(pycuda_device.get_attribute(cuda.device_attribute.L2_CACHE_SIZE))
        self._chunk_threads = settings.chunk_threads
        self._flat_threads = settings.flat_threads
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
            self._pressure = PressureKernel(self._driver, PressureKernel.compile(f"sm_{major}{minor}"), self._sms)
            facts = DeviceFacts(self._sms, self._l2_bytes, self._resident_blocks)
            self.policy = LaunchPolicy(vocab_size, facts, settings)
            self._copied = _void_p()
            result = self._driver.lib.cuEventCreate(ctypes.byref(self._copied), CU_EVENT_DISABLE_TIMING)
            self._driver.check(result, "cuEventCreate")
            self._capture_stream = _void_p()
            result = self._driver.lib.cuStreamCreate(ctypes.byref(self._capture_stream), CU_STREAM_NON_BLOCKING)
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
        self.last_launch: Launch | None = None  # the launch of the latest step queued (for tests and benchmarks)
        self._primary_threads: set[int] = set()
        self._row_base, self._row_stride = 0, 0  # uniform rows: base + row * stride; stride 0: the array
        self._last_tensor: _TensorKey | None = None
        self._last_kernel = KERNELS[0]  # (read only once _last_tensor is set)
        self._last_rows = 0

    def _load(self, cubin: bytes) -> dict[Kernel, _void_p]:
        """Load the compiled module (kept: its functions live as long as it does); look its kernels up."""
        self._module = self._driver.load_module(cubin)
        self._named: dict[str, _void_p] = {}  # kernels run_named looked up
        functions = {kernel: self.function(kernel.name) for kernel in KERNELS}
        self._resident_blocks = {  # blocks of each scan kernel all SMs hold at once
            kernel: self._driver.blocks_per_sm(functions[kernel], self._chunk_threads) * self._sms
            for kernel in SCAN_KERNELS
        }
        flat = {kernel.name: functions[kernel] for kernel in FLAT_KERNELS}
        bound = min(self._attribute(flat, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).values())
        if self._flat_threads > bound:
            raise ValueError(
                f"flat_threads={self._flat_threads}: this build's small-launch kernels take at most {bound}"
                " threads a block (raise LLGT_FLAT_BOUNDS)"
            )
        return functions

    def function(self, name: str) -> _void_p:
        """The compiled module's kernel ``name`` (benchmarks look up kernels of their own builds so)."""
        return self._driver.function(self._module, name)

    def registers(self) -> dict[str, int]:
        """Registers per thread of each kernel, by name (they bound how many blocks an SM holds at once)."""
        functions = {kernel.name: function for kernel, function in self._functions.items()}
        return self._attribute(functions, CU_FUNC_ATTRIBUTE_NUM_REGS)

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
        if self._share and self._shared is None:  # (grown past it later: a mask process's masks are copied in)
            fd, self._mapping = shared_bytes(size)
            self._host = np.frombuffer(self._mapping, dtype=np.uint8, count=size)
            pinned = self._driver.lib.cuMemHostRegister_v2(_void_p(self._host.ctypes.data), len(self._mapping), 0)
            self._driver.check(pinned, "cuMemHostRegister")  # (for the applier's life, as pagelocked memory is)
        else:
            self._host = cuda.pagelocked_empty(size, dtype=np.uint8)
        self._host_address = int(self._host.ctypes.data)
        self._device_buffer = cuda.mem_alloc(size)
        self._device_address = int(self._device_buffer)
        self._pointers = self._host[: self._pointer_bytes].view(np.uint64)
        masks = self._host[self._pointer_bytes :].view(np.int32)
        self._masks = torch.from_numpy(masks.reshape(rows, self.words))
        if self._share and self._shared is None:
            self._shared = SharedMasks(fd, self._pointer_bytes, rows, self.words, masks.reshape(rows, self.words))
        self._pressure.allocate(rows, self._device)
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

    def shared_masks(self) -> SharedMasks | None:
        return self._shared

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

    def launch_plan(
        self, logits: Sequence[torch.Tensor] | torch.Tensor, rows: Sequence[int] | None = None
    ) -> LaunchPlan | None:
        """The plan ``apply(logits, ...)`` would lay its launch out by, from a sample of the masks now
        in ``host_masks`` (None: that launch has one layout)."""
        step = self._set_pointers(logits, check_only=True, rows=rows)
        plan = None if step is None else self._plan(*step)
        return None if plan is None else LaunchPlan(plan)

    # Launching --------------------------------------------------------------------------------

    def apply(
        self,
        logits: Sequence[torch.Tensor] | torch.Tensor,
        stream_ptr: int,
        *,
        rows: Sequence[int] | None = None,
        report_pressure: bool = False,
    ) -> torch.Tensor | None:
        """Mask row ``i`` of ``logits`` with row ``i`` of ``host_masks``, queued on ``stream_ptr``.

        ``logits`` is a sequence of tensors ending in ``vocab`` (TensorRT-LLM's per-request views)
        or one tensor ``[..., vocab]`` whose leading dimensions are the rows; of a tensor, ``rows``
        chooses which rows are masked (row ``rows[i]`` with mask ``i``; None: all of them).
        ``report_pressure`` (one tensor's rows only) returns each masked row's removed mass and
        first-choice flag (:mod:`backend.grammar_pressure`), float32 ``[masked rows, 2]`` in pinned
        host memory that the stream fills (read it once the stream has passed this step; the next
        step's call overwrites it).
        """
        if (rows is not None or report_pressure) and not isinstance(logits, torch.Tensor):
            raise ValueError("rows and pressure are of one tensor's rows; pick the tensors of a sequence instead")
        step = self._set_pointers(logits, rows=rows)
        if step is None:
            return None
        kernel, count = step
        pressure = self._pressure.figures(count) if report_pressure else None
        if threading.get_ident() in self._primary_threads:
            self._queue(kernel, count, stream_ptr, report_pressure)
            return pressure
        # First call on this thread: is the primary context current (it is on threads that ran CUDA
        # work: torch's, TensorRT-LLM's)? Then remember the thread and skip this check from now on.
        # (Were another context made current later, the launch would fail loudly, not mask wrongly.)
        self._get_current(self._current_ref)
        if self._current_holder.value == self._primary:
            self._primary_threads.add(threading.get_ident())
            self._queue(kernel, count, stream_ptr, report_pressure)
        else:
            with self._current():
                self._queue(kernel, count, stream_ptr, report_pressure)
        return pressure

    def _queue(self, kernel: Kernel, rows: int, stream_ptr: int, pressure: bool = False) -> None:
        """The step's copy, event and launches: a graph replay when this shape was seen before."""
        plan = self._plan(kernel, rows)
        shape = (kernel, rows, self._row_base, self._row_stride, plan, pressure)
        graph = self._graphs.get(shape)
        if graph is None and self._use_graphs and shape in self._seen:
            graph = self._capture(shape)
        if graph is not None:
            if self._launch_graph(graph, stream_ptr):
                raise RuntimeError("cuGraphLaunch failed")
            return
        # A shape seen once is remembered, not captured: a caller whose logits move every step
        # (a new tensor each time) would otherwise pay for a capture every step.
        if len(self._seen) >= _MAX_SEEN:
            self._seen.clear()
        self._seen.add(shape)
        self._enqueue(kernel, rows, stream_ptr, plan, pressure=pressure)

    def _plan(self, kernel: Kernel, rows: int) -> str | None:
        """The plan (LaunchPlan's value) the policy gives this step, from a sample of its masks."""
        return self.policy.plan(kernel, rows, self._probe.plan)

    def _enqueue(
        self,
        kernel: Kernel,
        rows: int,
        stream_ptr: int,
        plan: str | None,
        *,
        capturing: bool = False,
        pressure: bool = False,
    ) -> None:
        if self._memcpy(*self._step_copy(rows), stream_ptr):
            raise RuntimeError("cuMemcpyHtoDAsync failed")
        if capturing:
            result = self._driver.lib.cuEventRecordWithFlags(self._copied, stream_ptr, CU_EVENT_RECORD_EXTERNAL)
        else:
            result = self._record(self._copied, stream_ptr)
        if result:
            raise RuntimeError(f"cuEventRecord failed with CUDA driver error {result}")
        if pressure:  # read the rows while they are whole, on the masks just copied
            self._set_rows(rows)
            self._pressure.launch(rows, kernel.dtype, self._params[:7], stream_ptr)
        self._launch(kernel, rows, stream_ptr, plan)

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

    def _capture(self, shape: _Shape) -> _void_p:
        """Capture the step for ``shape`` (copy, event, launch with today's parameters) as a graph."""
        kernel, rows, _, _, plan, pressure = shape
        executable = self._capture_graph(
            lambda stream_ptr: self._enqueue(kernel, rows, stream_ptr, plan, capturing=True, pressure=pressure)
        )
        if len(self._graphs) >= _MAX_GRAPHS:  # the oldest shape goes (freed once it has run)
            self._driver.lib.cuGraphExecDestroy(self._graphs.pop(next(iter(self._graphs))))
        self._graphs[shape] = executable
        return executable

    def _capture_graph(self, enqueue: Callable[[int], None]) -> _void_p:
        """An executable graph of what ``enqueue(stream_ptr)`` queues, captured on the capture stream
        (an event it records must be recorded with _CU_EVENT_RECORD_EXTERNAL to become a node)."""
        lib, stream = self._driver.lib, self._capture_stream
        self._driver.check(lib.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
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
        self, logits: Sequence[torch.Tensor] | torch.Tensor, stream_ptr: int, *, mask_stride: int | None = None
    ) -> None:
        """The kernel alone, on the pointers and masks already on the device (for benchmarks).

        ``mask_stride=0`` makes every row read row 0's mask, so the masks stay in L2: what the
        launch costs when reading them adds no DRAM traffic (a benchmark diagnostic).
        """
        step = self._set_pointers(logits, check_only=True)
        if step is None:
            return
        stride = self._param_ints[0]
        saved = stride.value
        if mask_stride is not None:
            stride.value = mask_stride
        try:
            with self._current():
                self._launch(*step, stream_ptr, self._plan(*step))
        finally:
            stride.value = saved

    def run_named(self, name: str, logits: torch.Tensor, stream_ptr: int, *, blocks: int, threads: int) -> None:
        """Launch the compiled module's kernel ``name`` (one with the mask kernels' parameters: a
        benchmark's own build, say) over ``blocks`` x the rows of ``logits``, on the masks already on
        the device."""
        step = self._set_pointers(logits, check_only=True)
        if step is None:
            return
        rows = step[1]
        with self._current():
            function = self._named.get(name)
            if function is None:
                function = self._named[name] = self.function(name)
            self._set_rows(rows)
            self._param_prefetch.value, self._param_row_count.value = 0, rows
            self._launch_function(function, blocks, rows, threads, stream_ptr, name=name)

    def _launch(self, kernel: Kernel, rows: int, stream_ptr: int, plan: str | None) -> None:
        launch = self.policy.launch(kernel, rows, plan, masks_back_to_back=self._param_ints[0].value == self.words)
        self.last_launch = launch
        self._set_rows(rows)
        if launch.groups:
            self._launch_groups(launch, stream_ptr)
            return
        self._param_prefetch.value = int(launch.prefetch)
        self._param_row_count.value = rows
        function = self._functions[launch.kernel]
        self._launch_function(function, launch.blocks, launch.rows, launch.threads, stream_ptr, name=launch.kernel.name)

    def _set_rows(self, rows: int) -> None:
        """The launch parameters that address a step's ``rows`` rows of logits."""
        self._param_rows.value = self._device_address + self._pointers_offset(rows)
        self._param_base.value, self._param_row_stride.value = self._row_base, self._row_stride

    def _launch_function(
        self, function: _void_p, blocks: int, rows: int, threads: int, stream_ptr: int, *, name: str
    ) -> None:
        """One launch of ``blocks`` x ``rows`` blocks of ``threads`` with the parameters as they are set."""
        if self._launch_kernel(function, blocks, rows, 1, threads, 1, 1, 0, stream_ptr, self._params, None):
            raise RuntimeError(f"cuLaunchKernel({name}) failed")

    def _launch_groups(self, launch: Launch, stream_ptr: int) -> None:
        """One launch per row group, each with the launch's blocks per row (the parameters are copied at
        each launch, so they are set anew for every group)."""
        element = launch.kernel.dtype.itemsize
        function, name = self._functions[launch.kernel], launch.kernel.name
        rows_address, base, masks = self._param_rows.value, self._param_base.value, self._param_masks.value
        try:
            for first, count in launch.groups:
                self._param_rows.value = rows_address + first * 8
                self._param_base.value = base + first * self._row_stride * element
                self._param_masks.value = masks + first * self.words * 4
                self._param_prefetch.value = int(self.policy.prefetches(launch.kernel, count, DENSE))
                self._launch_function(function, launch.blocks, count, launch.threads, stream_ptr, name=name)
        finally:
            self._param_masks.value = masks

    def _set_pointers(
        self,
        logits: Sequence[torch.Tensor] | torch.Tensor,
        check_only: bool = False,
        rows: Sequence[int] | None = None,
    ) -> tuple[Kernel, int] | None:
        """Write the rows' addresses into the pinned buffer; return the kernel to use and the row
        count (None: no rows)."""
        if isinstance(logits, torch.Tensor):
            key = (
                logits.data_ptr(),
                logits.shape,
                logits.stride(),
                logits.dtype,
                None if rows is None else tuple(rows),
            )
            if key == self._last_tensor:
                return self._last_kernel, self._last_rows  # the same rows as last step: pointers in place
            addresses = tensor_rows(logits, self.vocab_size, rows)
        else:
            key = None
            addresses = request_rows(logits, self.vocab_size)
        self._last_tensor = None
        count = addresses.count
        if count == 0:
            return None
        if count > self._max_rows:
            raise ValueError(f"{count} rows; call host_masks({count}) first")
        self._row_base, self._row_stride = addresses.base, addresses.stride
        kernel = self.policy.kernel(addresses.dtype, addresses.aligned, count)
        if not check_only:
            self._pointers[self._max_rows - count :] = addresses.pointers
            if key is not None:
                self._last_tensor, self._last_kernel, self._last_rows = key, kernel, count
        return kernel, count
