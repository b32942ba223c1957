"""The grammar's pressure from the CUDA applier against the CPU reference (GPU machine only).

Run there with ``python -m pytest -c /dev/null --confcutdir=tests/gpu tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

from backend.grammar_pressure import pressure_of
from backend.masking import allowed_tokens, apply_token_bitmask_cpu
from tests.gpu.test_cuda_masking import KINDS, VOCABS, masks, same_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
]


@pytest.fixture(scope="module")
def appliers() -> dict[int, object]:
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    return {vocab: CudaBitmaskApplier(torch.device("cuda"), 64, vocab) for vocab in VOCABS}


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chosen", ["all", "some"])
def test_the_kernel_reports_what_the_reference_computes_and_still_masks_exactly(
    appliers: dict[int, object], vocab: int, dtype: torch.dtype, kind: str, chosen: str
) -> None:
    applier = appliers[vocab]
    rows = 24
    generator = torch.Generator().manual_seed(vocab + rows)
    logits = (torch.randn((rows, vocab), generator=generator) * 3).to(dtype)
    logits[5, : vocab // 2] = float("-inf")  # a bias that already refused half the row
    logits[7] = float("-inf")  # a row with nothing left
    picked = list(range(rows)) if chosen == "all" else [20, 3, 5, 7, 11]
    mask = masks(kind, len(picked), vocab, generator)
    expected = pressure_of(logits[picked], allowed_tokens(mask, vocab))
    masked = logits.clone()
    for index, row in enumerate(picked):
        apply_token_bitmask_cpu(masked[row], mask[index])

    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(3):  # the first step's launches, the second's, the replay of the graph it captured
        gpu = logits.cuda()
        applier.host_masks(len(picked)).copy_(mask)  # type: ignore[attr-defined]
        reported = applier.apply(  # type: ignore[attr-defined]
            gpu, stream, rows=None if chosen == "all" else picked, report_pressure=True
        )

        torch.cuda.current_stream().synchronize()  # (the figures land in host memory on the stream)
        got = reported.clone()
        assert torch.allclose(got[:, 0], expected[:, 0], atol=2e-4, rtol=0), (got.tolist(), expected.tolist())
        assert torch.equal(got[:, 1], expected[:, 1]), (got.tolist(), expected.tolist())
        assert same_bits(gpu, masked)


def test_steps_with_and_without_pressure_are_graphs_of_their_own(appliers: dict[int, object]) -> None:
    applier = appliers[VOCABS[0]]
    rows, vocab = 4, VOCABS[0]
    stream = torch.cuda.current_stream().cuda_stream
    logits = torch.empty((rows, vocab), device="cuda")
    before = applier.captured_shapes  # type: ignore[attr-defined]
    for report in (True, True, False, False, True):
        logits.copy_(torch.randn((rows, vocab)))  # (the same tensor: the same shape every step)
        applier.host_masks(rows).fill_(0)  # type: ignore[attr-defined]
        reported = applier.apply(logits, stream, report_pressure=report)  # type: ignore[attr-defined]
        assert (reported is not None) == report
        if reported is not None:
            torch.cuda.current_stream().synchronize()
            assert reported.tolist() == [[1.0, 1.0]] * rows  # nothing allowed: all of it removed
    assert applier.captured_shapes == before + 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("vocab", [32001, 128256])  # rows 16-byte aligned or not: the two read paths
@pytest.mark.parametrize("rows", [100, 300, 1200])  # fewer chunks per row as the rows grow, down to one
def test_many_rows_are_reported_as_the_reference_computes(appliers: dict[int, object], vocab: int, rows: int) -> None:
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    applier = appliers.get(vocab) or CudaBitmaskApplier(torch.device("cuda"), rows, vocab)
    generator = torch.Generator().manual_seed(rows)
    logits = (torch.randn((rows, vocab), generator=generator) * 3).to(torch.bfloat16)
    mask = masks("random", rows, vocab, generator)
    expected = pressure_of(logits, allowed_tokens(mask, vocab))
    stream = torch.cuda.current_stream()
    for _ in range(2):  # the second step finds the row counts the first left
        applier.host_masks(rows).copy_(mask)  # type: ignore[attr-defined]
        reported = applier.apply(logits.cuda(), stream.cuda_stream, report_pressure=True)  # type: ignore[attr-defined]
        stream.synchronize()
        assert torch.allclose(reported[:, 0], expected[:, 0], atol=2e-4, rtol=0)
        assert torch.equal(reported[:, 1], expected[:, 1])
