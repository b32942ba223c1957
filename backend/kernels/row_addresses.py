"""Where the logits rows a step masks live on the device: the addresses the mask kernel reads.

Pure arithmetic on torch's shapes and strides (no CUDA call): the tests read CPU tensors
(``device="cpu"``); the applier accepts only CUDA ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch


@dataclass(frozen=True, eq=False)
class RowAddresses:
    """The rows to mask, in mask order.

    ``pointers`` holds each row's address (uint64). When the rows are evenly spaced the kernel
    computes them instead, from ``base`` (the first row's address) and ``stride`` (elements from
    one row to the next); ``stride`` 0 means it reads ``pointers``.
    """

    pointers: npt.NDArray[np.uint64]
    base: int
    stride: int
    dtype: torch.dtype

    @property
    def count(self) -> int:
        return len(self.pointers)

    @property
    def aligned(self) -> bool:
        """Whether every row starts on 16 bytes (the vector kernels' requirement)."""
        return not bool(np.any(self.pointers & np.uint64(15)))


def tensor_rows(
    logits: torch.Tensor, vocab_size: int, rows: Sequence[int] | None = None, *, device: str = "cuda"
) -> RowAddresses:
    """The rows of one tensor ``[..., vocab_size]`` (leading dimensions flattened), or those of them
    listed in ``rows``; strided views such as ``[batch, beams, vocab_padded][..., :vocab]`` need no copy.

    Refuses (``ValueError``) a tensor the kernel would mask wrongly or write past, and a row index
    out of range.
    """
    if logits.shape[-1] != vocab_size or logits.stride(-1) != 1 or logits.device.type != device:
        raise ValueError(
            f"logits must be a {device} tensor [..., {vocab_size}] with unit stride, not {list(logits.shape)}"
            f" on {logits.device}"
        )
    offsets = np.zeros(1, dtype=np.int64)
    for size, stride in zip(logits.shape[:-1], logits.stride()[:-1], strict=True):
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).reshape(-1)
    if rows is not None:
        chosen = np.asarray(rows, dtype=np.int64)
        if chosen.size and (chosen.min() < 0 or chosen.max() >= len(offsets)):
            raise ValueError(f"row indices must lie in [0, {len(offsets)}), not {list(rows)}")
        offsets = offsets[chosen]
    item = logits.element_size()
    pointers = (offsets * item + logits.data_ptr()).astype(np.uint64)
    steps = np.diff(offsets)
    if len(offsets) == 1 or (len(offsets) > 1 and steps[0] > 0 and bool(np.all(steps == steps[0]))):
        stride = int(steps[0]) if len(offsets) > 1 else vocab_size
        return RowAddresses(pointers, int(pointers[0]), stride, logits.dtype)
    return RowAddresses(pointers, 0, 0, logits.dtype)


def request_rows(logits: Sequence[torch.Tensor], vocab_size: int, *, device: str = "cuda") -> RowAddresses:
    """One row per tensor (TensorRT-LLM's per-request views), after checking that each is one row of
    the vocabulary's logits, contiguous, on the GPU, all of one dtype and shape.

    The first row's shape is checked once, the others are compared with it (one attribute each,
    not two), in the loop that collects the addresses. A tensor of several rows
    (``[1, beams, vocab]``) is refused: it has one mask, and only its first row would be masked.
    """
    if not logits:
        return RowAddresses(np.zeros(0, dtype=np.uint64), 0, 0, torch.float32)
    first = logits[0]
    shape, dtype = first.shape, first.dtype
    if shape[-1] != vocab_size or first.numel() != vocab_size:
        raise ValueError(
            f"logits row 0 must be one row of {vocab_size} logits ([..., {vocab_size}]), not {list(shape)}"
        )
    cuda = device == "cuda"  # (one attribute a row on the serving path, not a device object)
    pointers = []
    for index, row in enumerate(logits):
        # (A one-row tensor is contiguous exactly when its last stride is 1.)
        on_device = row.is_cuda if cuda else row.device.type == device
        if row.shape != shape or row.dtype != dtype or not row.is_contiguous() or not on_device:
            raise ValueError(
                f"logits row {index} must be a {device} tensor {list(shape)} of {dtype} with unit stride,"
                f" like row 0; it is {list(row.shape)} of {row.dtype} on {row.device}, strides {row.stride()}"
            )
        pointers.append(row.data_ptr())
    return RowAddresses(np.asarray(pointers, dtype=np.uint64), 0, 0, dtype)
