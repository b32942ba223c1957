"""The grammar's pressure on the GPU: ``grammar_pressure.cu``, launched by the mask applier between the
step's mask copy and the mask kernel, so it reads each row's logits once while they are still whole;
it writes the figures into mapped host memory, so that the step loop reads them with no copy or wait
of its own once the step's tokens are back."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from backend.kernels.driver import Driver

PRESSURE_SOURCE = Path(__file__).with_name("grammar_pressure.cu")
_THREADS = 256  # PRESSURE_THREADS in the source
_MOST_CHUNKS = 16  # blocks per row, at most
_PARTIAL_FLOATS = 6  # sizeof(Partial) / 4
_NAMES = {torch.float32: "pressure_f32", torch.float16: "pressure_f16", torch.bfloat16: "pressure_bf16"}
_void_p = ctypes.c_void_p


class PressureKernel:
    """The compiled pressure kernels of one device, launched with the mask kernels' row addressing."""

    def __init__(self, driver: Driver, cubin: bytes, sms: int) -> None:
        self._driver = driver
        self._module = driver.load_module(cubin)  # (kept: its functions live as long as it does)
        self._functions = {dtype: driver.function(self._module, name) for dtype, name in _NAMES.items()}
        # Blocks all SMs hold at once: a step's rows get as many chunks as fill one wave of them (a
        # second, part-filled wave would cost as long as the first).
        self._resident = {
            dtype: driver.blocks_per_sm(function, _THREADS) * sms for dtype, function in self._functions.items()
        }
        # The launch's own parameters, after the mask kernels' seven: where the chunks' partial
        # results go, how many chunks, each row's count of finished chunks, the figures.
        self._parts = ctypes.c_uint64(0)
        self._chunks = ctypes.c_int(1)
        self._finished = ctypes.c_uint64(0)
        self._out = ctypes.c_uint64(0)
        holders = (self._parts, self._chunks, self._finished, self._out)
        self._own_params = [ctypes.cast(ctypes.pointer(holder), _void_p).value for holder in holders]
        self._buffers: tuple[torch.Tensor, ...] = ()
        self._host = torch.empty((0, 2))
        self._mapped: object = None

    @staticmethod
    def compile(arch: str) -> bytes:
        from pycuda.compiler import compile as compile_cuda

        return bytes(compile_cuda(PRESSURE_SOURCE.read_text(), no_extern_c=True, options=["-O3"], arch=arch))

    def allocate(self, rows: int, device: torch.device) -> None:
        """Room for ``rows`` rows (the graphs that point at the old room are dropped by the applier,
        which calls this, with the device's context current)."""
        import pycuda.driver as cuda

        parts = torch.empty(rows * _MOST_CHUNKS * _PARTIAL_FLOATS, dtype=torch.float32, device=device)
        finished = torch.zeros(rows, dtype=torch.int32, device=device)  # (the kernel leaves it at 0)
        self._buffers = (parts, finished)
        self._parts.value, self._finished.value = parts.data_ptr(), finished.data_ptr()
        # The kernel writes the figures straight into mapped host memory: a copy after it would be
        # one more node on the step's path (a few µs), for 8 bytes a row.
        mapped = cuda.pagelocked_empty((rows, 2), np.float32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
        self._mapped = mapped  # (kept: the host tensor is a view of it)
        self._host = torch.from_numpy(mapped)
        self._out.value = int(mapped.base.get_device_pointer())

    def figures(self, rows: int) -> torch.Tensor:
        """The last launch's figures, float32 ``[rows, 2]`` in pinned host memory: read them once the
        stream has passed the launch (the next launch overwrites them)."""
        return self._host[:rows]

    def launch(self, rows: int, dtype: torch.dtype, row_params: Sequence[int | None], stream_ptr: int) -> None:
        """Queue the reduction of ``rows`` rows of ``dtype`` logits, whose figures land in host memory.

        ``row_params`` are the mask kernels' first seven parameters as set for the step (row
        pointers, base, row stride, masks, mask stride, mask words, vocab): the rows are read as
        they read them.
        """
        if rows > len(self._host):
            raise ValueError(f"{rows} rows; allocate({rows}) first")
        self._chunks.value = max(1, min(_MOST_CHUNKS, self._resident[dtype] // rows))
        params = (_void_p * 11)(*row_params, *self._own_params)
        if self._driver.lib.cuLaunchKernel(
            self._functions[dtype], self._chunks.value, rows, 1, _THREADS, 1, 1, 0, stream_ptr, params, None
        ):
            raise RuntimeError(f"cuLaunchKernel({_NAMES[dtype]}) failed")
