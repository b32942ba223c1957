"""The loader's launch thresholds agree with the kernel source's (no GPU needed)."""

from __future__ import annotations

import re

from backend.kernels.cuda_masking import GROUP_MASK_BYTES, KERNEL_SOURCE


def test_row_groups_take_as_many_masks_as_the_kernel_prefetches() -> None:
    """A group with more masks than LLGT_PREFETCH_MAX_MIB would not prefetch them: the split would
    only add launches."""
    match = re.search(r"#define LLGT_PREFETCH_MAX_MIB (\d+)", KERNEL_SOURCE.read_text())
    assert match is not None
    assert int(match.group(1)) << 20 == GROUP_MASK_BYTES
