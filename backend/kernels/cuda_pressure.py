"""The grammar's pressure on the GPU: ``grammar_pressure.cu``, launched by the mask applier between the
step's mask copy and the mask kernel, so it reads each row's logits once while they are still whole:
a grid of chunks of every row, then a warp per row merging its chunks."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import torch

from backend.kernels.driver import Driver

PRESSURE_SOURCE = Path(__file__).with_name("grammar_pressure.cu")
_THREADS = 256  # PRESSURE_THREADS in the source
_CHUNKS = 16  # blocks per row: at 64 rows, a thousand blocks of ~8k logits each
_PARTIAL_FLOATS = 6  # sizeof(Partial) / 4
_NAMES = {torch.float32: "pressure_f32", torch.float16: "pressure_f16", torch.bfloat16: "pressure_bf16"}
_void_p = ctypes.c_void_p


class PressureKernel:
    """The compiled pressure kernels of one device, launched with the mask kernels' row addressing."""

    def __init__(self, driver: Driver, cubin: bytes) -> None:
        self._driver = driver
        module = _void_p()
        driver.check(driver.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        self._module = module  # (kept: its functions live as long as it does)
        self._functions = {dtype: self._function(name) for dtype, name in _NAMES.items()}
        self._merge = self._function("pressure_merge")
        # The launches' own parameters, after the mask kernels' seven: where the chunks' partial
        # results go, and how many chunks; then the merge's.
        self._parts = ctypes.c_uint64(0)
        self._chunks = ctypes.c_int(_CHUNKS)
        self._out = ctypes.c_uint64(0)
        self._parts_buffer = torch.empty(0)

    def _function(self, name: str) -> _void_p:
        function = _void_p()
        result = self._driver.lib.cuModuleGetFunction(ctypes.byref(function), self._module, name.encode())
        self._driver.check(result, f"cuModuleGetFunction({name})")
        return function

    @staticmethod
    def compile(arch: str) -> bytes:
        from pycuda.compiler import compile as compile_cuda

        return bytes(compile_cuda(PRESSURE_SOURCE.read_text(), no_extern_c=True, options=["-O3"], arch=arch))

    def allocate(self, rows: int, device: torch.device) -> None:
        """Room for ``rows`` rows' partial results (the graphs that point at the old room are dropped
        by the applier, which calls this)."""
        self._parts_buffer = torch.empty(rows * _CHUNKS * _PARTIAL_FLOATS, dtype=torch.float32, device=device)
        self._parts.value = self._parts_buffer.data_ptr()

    def launch(self, out: torch.Tensor, dtype: torch.dtype, row_params: Sequence[int | None], stream_ptr: int) -> None:
        """Queue the reduction of ``out``'s rows (float32 ``[rows, 2]`` on the device) of ``dtype`` logits.

        ``row_params`` are the mask kernels' first seven parameters as set for the step (row
        pointers, base, row stride, masks, mask stride, mask words, vocab): the rows are read as
        they read them.
        """
        rows = out.shape[0]
        if out.dtype != torch.float32 or tuple(out.shape) != (rows, 2) or not out.is_contiguous():
            shape = list(out.shape)
            raise ValueError(f"the pressure goes into a contiguous float32 [rows, 2] tensor, not {out.dtype} {shape}")
        if rows * _CHUNKS * _PARTIAL_FLOATS > self._parts_buffer.numel():
            raise ValueError(f"{rows} rows; allocate({rows}) first")
        self._out.value = out.data_ptr()
        parts, chunks, out_param = (
            ctypes.cast(ctypes.pointer(h), _void_p).value for h in (self._parts, self._chunks, self._out)
        )
        # (row_params: rows, base, stride, masks, mask stride, mask words, vocab)
        chunk_params = (_void_p * 9)(*row_params, parts, chunks)
        merge_params = (_void_p * 7)(parts, chunks, *row_params[3:7], out_param)
        launch = self._driver.lib.cuLaunchKernel
        if launch(self._functions[dtype], _CHUNKS, rows, 1, _THREADS, 1, 1, 0, stream_ptr, chunk_params, None):
            raise RuntimeError(f"cuLaunchKernel({_NAMES[dtype]}) failed")
        if launch(self._merge, rows, 1, 1, 32, 1, 1, 0, stream_ptr, merge_params, None):
            raise RuntimeError("cuLaunchKernel(pressure_merge) failed")
