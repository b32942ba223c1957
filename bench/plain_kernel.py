"""The plain comparison kernel of the kernel benchmark: one thread per logit (``mask_naive`` in
``backend/kernels/mask_logits.cu``, built only with :data:`PLAIN_KERNELS`, never for serving)."""

from __future__ import annotations

import torch

from backend.kernels.cuda_masking import CudaBitmaskApplier

PLAIN_KERNELS = "LLGT_NAIVE_KERNELS"  # the define that builds them: CudaBitmaskApplier(..., defines=[PLAIN_KERNELS])
_NAMES = {torch.float32: "naive_f32", torch.float16: "naive_f16", torch.bfloat16: "naive_bf16"}
_THREADS = 256
_MAX_BLOCKS = 64  # per row; the threads stride over the rest of the row


def run_plain(applier: CudaBitmaskApplier, logits: torch.Tensor, stream_ptr: int) -> None:
    """Mask ``logits`` with the plain kernel of ``applier``'s build, on the masks already on the device
    (an ``apply`` on the same rows copied them there)."""
    blocks = max(1, min(_MAX_BLOCKS, (applier.vocab_size + _THREADS - 1) // _THREADS))
    applier.run_named(_NAMES[logits.dtype], logits, stream_ptr, blocks=blocks, threads=_THREADS)
