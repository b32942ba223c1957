"""The grammar's pressure on the GPU: ``grammar_pressure.cu``, one block per row, launched by the mask
applier between the step's mask copy and the mask kernel, so it reads each row's logits once while
they are still whole."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import torch

from backend.kernels.driver import Driver

PRESSURE_SOURCE = Path(__file__).with_name("grammar_pressure.cu")
_THREADS = 512  # PRESSURE_THREADS in the source
_NAMES = {torch.float32: "pressure_f32", torch.float16: "pressure_f16", torch.bfloat16: "pressure_bf16"}
_void_p = ctypes.c_void_p


class PressureKernel:
    """The compiled pressure kernels of one device, launched with the mask kernels' row addressing."""

    def __init__(self, driver: Driver, cubin: bytes) -> None:
        self._driver = driver
        module = _void_p()
        driver.check(driver.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        self._module = module  # (kept: its functions live as long as it does)
        self._functions: dict[torch.dtype, _void_p] = {}
        for dtype, name in _NAMES.items():
            function = _void_p()
            result = driver.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode())
            driver.check(result, f"cuModuleGetFunction({name})")
            self._functions[dtype] = function
        self._out = ctypes.c_uint64(0)
        self._out_param = ctypes.cast(ctypes.pointer(self._out), _void_p).value

    @staticmethod
    def compile(arch: str) -> bytes:
        from pycuda.compiler import compile as compile_cuda

        return bytes(compile_cuda(PRESSURE_SOURCE.read_text(), no_extern_c=True, options=["-O3"], arch=arch))

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
        self._out.value = out.data_ptr()
        params = (_void_p * 8)(*row_params, self._out_param)
        function = self._functions[dtype]
        if self._driver.lib.cuLaunchKernel(function, rows, 1, 1, _THREADS, 1, 1, 0, stream_ptr, params, None):
            raise RuntimeError(f"cuLaunchKernel({_NAMES[dtype]}) failed")
