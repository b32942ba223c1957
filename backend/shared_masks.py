"""Host memory that two processes map: where a mask process writes a step's masks for the engine to copy to the GPU.

The memory is an anonymous file (``memfd``): nothing in the file system to leak however a process
ends, and its descriptor passes to a child that maps it (a restarted child maps it again). The
appliers' host buffers come from here when a mask process fills them, so that its masks need no
copy in the engine's step loop (4 MB a step at 256 rows of a 128k vocabulary).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from backend.matcher_table import Bitmask


@dataclass(frozen=True, eq=False)
class SharedMasks:
    """``rows`` bitmask rows of ``words`` words at byte ``offset`` of the file ``fd``; ``masks`` is this
    process's view of them."""

    fd: int
    offset: int
    rows: int
    words: int
    masks: Bitmask


def shared_bytes(size: int) -> tuple[int, mmap.mmap]:
    """A new anonymous file of ``size`` bytes (rounded up to whole pages) and this process's mapping of it."""
    size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    fd = os.memfd_create("llgtriton-masks")
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def own_shared_masks(rows: int, words: int) -> SharedMasks:
    """Shared masks in a file of their own (a mask process whose applier keeps its own buffer)."""
    fd, mapping = shared_bytes(rows * words * 4)
    return SharedMasks(
        fd, 0, rows, words, np.frombuffer(mapping, dtype=np.int32, count=rows * words).reshape(rows, words)
    )


def map_shared_masks(fd: int, offset: int, rows: int, words: int) -> Bitmask:
    """The child's view of masks another process shared (its descriptor inherited)."""
    mapping = mmap.mmap(fd, offset + rows * words * 4)
    return np.frombuffer(mapping, dtype=np.int32, count=rows * words, offset=offset).reshape(rows, words)
