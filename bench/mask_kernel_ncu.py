"""One cell of the kernel benchmark, ours and xgrammar's CUDA kernel in turn, for Nsight Compute.

ncu flushes the caches before each kernel it profiles and runs it at base clocks, so it shows what a
launch costs when its logits and masks are not in L2 (``bench.mask_kernel`` calls each kernel over
and over on the same tensors, so small launches find them there):

    ncu --set full --kernel-name regex:"flat|scan|mask|words|Logits" --launch-skip 2 --launch-count 4 \
        python -m bench.mask_kernel_ncu --xgrammar /tmp/xgrammar --vocab 128256 --batch 8 --dtype bf16 --kind all
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from backend.kernels.cuda_masking import CudaBitmaskApplier
from bench.mask_kernel import DTYPES, MASK_KINDS, load_module, make_masks

logger = logging.getLogger("bench.mask_kernel_ncu")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xgrammar", type=Path, required=True, help="unpacked xgrammar wheel (its kernels/ folder)")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--kind", default="all", choices=MASK_KINDS)
    parser.add_argument("--calls", type=int, default=3, help="calls of each kernel, in turn")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kernels = arguments.xgrammar / "xgrammar" / "kernels" / "apply_token_bitmask_inplace_cuda.py"
    xgrammar = load_module(kernels, "xgr_cuda")
    if xgrammar is None:
        parser.error(f"cannot load xgrammar's CUDA kernel from {kernels}")
    device = torch.device("cuda")
    batch, vocab = arguments.batch, arguments.vocab
    logits = torch.randn((batch, vocab), device=device).to(DTYPES[arguments.dtype])
    masks = make_masks(arguments.kind, batch, vocab, torch.Generator().manual_seed(0))
    applier = CudaBitmaskApplier(device, batch, vocab)
    stream_ptr = torch.cuda.current_stream().cuda_stream
    applier.host_masks(batch).copy_(masks)
    applier.apply(logits, stream_ptr)  # the masks and row pointers onto the device
    masks_gpu = masks.to(device)
    for _ in range(arguments.calls):
        applier.run_resident(logits, stream_ptr)
        xgrammar.apply_token_bitmask_inplace_cuda(logits, masks_gpu)
    torch.cuda.synchronize()
    logger.info("%d calls of each kernel, %s masks on %s logits", arguments.calls, arguments.kind, tuple(logits.shape))


if __name__ == "__main__":
    main()
