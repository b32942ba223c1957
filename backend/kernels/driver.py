"""The few CUDA driver API calls the mask applier makes (ctypes, on ``libcuda.so.1``), their types declared.

The driver API, not PyCUDA's launch: PyCUDA launches only on its own stream objects, while the
engine hands the post-processor a raw ``stream_ptr``.
"""

from __future__ import annotations

import ctypes

_void_p = ctypes.c_void_p
CU_EVENT_DISABLE_TIMING = 2
CU_EVENT_RECORD_EXTERNAL = 1  # an event recorded during capture becomes a node of the graph
CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_RELAXED = 2  # capturing here leaves other threads' CUDA calls alone
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0


class Driver:
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
            "cuMemHostRegister_v2": [_void_p, ctypes.c_size_t, ctypes.c_uint],
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

    def load_module(self, cubin: bytes) -> _void_p:
        """A compiled module, loaded into the current context (keep it: its functions live as long as it does)."""
        module = _void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        return module

    def function(self, module: _void_p, name: str) -> _void_p:
        """``module``'s kernel ``name``."""
        function = _void_p()
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), f"cuModuleGetFunction({name})"
        )
        return function

    def blocks_per_sm(self, function: _void_p, threads: int) -> int:
        """How many blocks of ``threads`` threads of ``function`` an SM holds at once (at least 1)."""
        per_sm = ctypes.c_int()
        result = self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per_sm), function, threads, 0)
        self.check(result, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return max(1, per_sm.value)

    def current_context(self) -> int | None:
        context = _void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        return context.value
