"""Applying llguidance token bitmasks to logits: the CPU path, and the reference the GPU kernel must match.

A bitmask row is int32 ``[ceil(V / 32)]``; token ``t`` is allowed when bit ``t & 31`` of word
``t >> 5`` is set. Disallowed logits become ``-inf``; columns past the mask are disallowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from backend.grammar_pressure import pressure_of
from backend.shared_masks import SharedMasks, shared_bytes

_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Boolean ``[..., vocab_size]`` view of a bitmask ``[..., words]``."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    allowed = bits.flatten(-2).bool()
    width = allowed.shape[-1]
    if width >= vocab_size:
        return allowed[..., :vocab_size]
    padding = torch.zeros((*allowed.shape[:-1], vocab_size - width), dtype=torch.bool, device=allowed.device)
    return torch.cat([allowed, padding], dim=-1)


def apply_token_bitmask_cpu(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set the logits of disallowed tokens to -inf, in place; ``logits`` is ``[..., V]``."""
    allowed = allowed_tokens(bitmask, logits.shape[-1])
    logits.masked_fill_(~allowed, float("-inf"))


class BitmaskApplier(Protocol):
    """Where a step's masks are written (``host_masks``) and how they reach the logits (``apply``)."""

    def host_masks(self, rows: int) -> torch.Tensor: ...

    def shared_masks(self) -> SharedMasks | None:
        """Where a mask process may write ``host_masks``' rows itself (None: this buffer is not shared)."""
        ...

    def apply(
        self,
        logits: Sequence[torch.Tensor] | torch.Tensor,
        stream_ptr: int,
        *,
        rows: Sequence[int] | None = None,
        report_pressure: bool = False,
    ) -> torch.Tensor | None:
        """Mask row ``i`` of ``logits`` with row ``i`` of ``host_masks``, in place.

        ``logits`` is one tensor ``[..., vocab_size]`` whose leading dimensions are the rows (an
        engine's step), of which ``rows`` picks those to mask (row ``rows[i]`` gets mask ``i``;
        None: every row), or one tensor per request, each one row ``[1, ..., 1, vocab_size]``
        (TensorRT-LLM's shape); a tensor of several rows there is refused (``ValueError``).
        ``report_pressure`` (one tensor only) returns, float32 ``[masked rows, 2]``, row ``i``'s
        :func:`~backend.grammar_pressure.pressure_of` as its mask ``i`` finds it: on the logits'
        device, or in host memory that ``stream_ptr`` fills (read it once the stream has passed the
        step); the next call may overwrite it.
        """
        ...


class CpuBitmaskApplier:
    """The CPU path: masks in an ordinary tensor (``shared``: in memory a mask process maps), applied
    with vectorised torch ops."""

    def __init__(self, vocab_size: int, rows: int, *, shared: bool = False) -> None:
        self.vocab_size = vocab_size
        words = (vocab_size + 31) // 32
        self._shared: SharedMasks | None = None
        if shared:
            fd, mapping = shared_bytes(rows * words * 4)
            masks = np.frombuffer(mapping, dtype=np.int32, count=rows * words).reshape(rows, words)
            self._shared = SharedMasks(fd, 0, rows, words, masks)
            self._masks = torch.from_numpy(masks)
            self._masks.fill_(-1)
        else:
            self._masks = torch.full((rows, words), -1, dtype=torch.int32)

    def host_masks(self, rows: int) -> torch.Tensor:
        if rows > self._masks.shape[0]:  # (a mask process then writes its own memory, copied from there)
            self._masks = torch.full((rows, self._masks.shape[1]), -1, dtype=torch.int32)
        return self._masks[:rows]

    def shared_masks(self) -> SharedMasks | None:
        return self._shared

    def apply(
        self,
        logits: Sequence[torch.Tensor] | torch.Tensor,
        stream_ptr: int,
        *,
        rows: Sequence[int] | None = None,
        report_pressure: bool = False,
    ) -> torch.Tensor | None:
        if isinstance(logits, torch.Tensor):
            if logits.shape[-1] != self.vocab_size:
                raise ValueError(f"logits must be [..., {self.vocab_size}], not {list(logits.shape)}")
            flat = logits.view(-1, self.vocab_size)  # a view: the masking stays in place
            chosen = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long)
            picked = flat if chosen is None else flat[chosen]  # (a copy: written back below)
            allowed = allowed_tokens(self._masks[: picked.shape[0]], self.vocab_size)
            pressure = pressure_of(picked, allowed) if report_pressure else None
            picked.masked_fill_(~allowed, float("-inf"))
            if chosen is not None:
                flat[chosen] = picked
            return pressure
        if rows is not None or report_pressure:
            raise ValueError("rows and pressure are of one tensor's rows; pick the tensors of a sequence instead")
        for index, row in enumerate(logits):
            if row.shape[-1] != self.vocab_size or row.numel() != self.vocab_size:  # the CUDA applier's contract too
                raise ValueError(f"logits row {index} must be one row [..., {self.vocab_size}], not {list(row.shape)}")
        for index, row in enumerate(logits):
            apply_token_bitmask_cpu(row, self._masks[index])
        return None


def bitmask_applier(device: torch.device, vocab_size: int, rows: int, *, shared: bool = False) -> BitmaskApplier:
    """The CUDA kernel for CUDA devices (PyCUDA, imported only then), the CPU path otherwise; ``shared``:
    its host buffer in memory a mask process can map."""
    if device.type == "cuda":
        from backend.kernels.cuda_masking import CudaBitmaskApplier

        return CudaBitmaskApplier(device, rows, vocab_size, shared=shared)
    return CpuBitmaskApplier(vocab_size, rows, shared=shared)
