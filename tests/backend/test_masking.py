"""The CPU bitmask path against a bit-by-bit reference (it is also the GPU kernel's oracle)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.masking import CpuBitmaskApplier, allowed_tokens, apply_token_bitmask_cpu


def reference_allowed(words: list[int], vocab_size: int) -> list[bool]:
    return [t < 32 * len(words) and bool((words[t >> 5] >> (t & 31)) & 1) for t in range(vocab_size)]


@st.composite
def masks(draw: st.DrawFn) -> tuple[list[int], int]:
    vocab_size = draw(st.integers(1, 300))
    words = draw(st.integers(max(1, (vocab_size + 31) // 32 - 1), (vocab_size + 31) // 32 + 1))
    kind = draw(st.sampled_from(["random", "all", "none", "one"]))
    if kind == "all":
        values = [-1] * words
    elif kind == "none":
        values = [0] * words
    elif kind == "one":
        token = draw(st.integers(0, 32 * words - 1))
        values = [0] * words
        values[token >> 5] = (1 << (token & 31)) - (1 << 32 if token & 31 == 31 else 0)
    else:
        values = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=words, max_size=words))
    return values, vocab_size


@settings(deadline=None, max_examples=300)
@given(masks(), st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_cpu_mask_matches_bit_by_bit_reference(mask: tuple[list[int], int], dtype: torch.dtype) -> None:
    words, vocab_size = mask
    bitmask = torch.tensor(words, dtype=torch.int32)
    expected = reference_allowed(words, vocab_size)
    assert allowed_tokens(bitmask, vocab_size).tolist() == expected
    logits = torch.randn(1, 1, vocab_size).to(dtype)
    original = logits.clone()
    apply_token_bitmask_cpu(logits, bitmask)
    for token, allowed in enumerate(expected):
        value = logits[0, 0, token]
        assert (value == original[0, 0, token]) if allowed else (value == float("-inf"))


def test_rows_of_a_batch_get_their_own_masks() -> None:
    logits = torch.zeros(2, 64)
    bitmask = torch.tensor([[1, 0], [0, 1 << 3]], dtype=torch.int32)
    apply_token_bitmask_cpu(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [35]


def test_the_cpu_applier_refuses_a_request_tensor_of_several_rows_and_masks_none() -> None:
    """One mask per request tensor: a tensor of two beams is refused, as the CUDA applier refuses it,
    before any row is masked."""
    applier = CpuBitmaskApplier(64, 2)
    applier.host_masks(2).zero_()
    rows = [torch.zeros(1, 1, 64), torch.zeros(1, 2, 64)]
    with pytest.raises(ValueError, match=r"row 1 must be one row \[\.\.\., 64\], not \[1, 2, 64\]"):
        applier.apply(rows, 0)
    assert all(torch.isfinite(row).all() for row in rows)


def test_the_cpu_applier_masks_the_chosen_rows_of_a_step_and_leaves_the_others() -> None:
    applier = CpuBitmaskApplier(64, 3)
    masks = applier.host_masks(2)
    masks.zero_()
    masks[0, 0], masks[1, 1] = 1 << 4, 1 << 2  # row 2 may be token 4, row 0 token 34
    logits = torch.zeros(3, 64)
    applier.apply(logits, 0, rows=[2, 0])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [34]
    assert torch.isfinite(logits[1]).all()  # unconstrained
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == [4]


def test_the_cpu_applier_masks_every_row_of_a_step_by_default() -> None:
    applier = CpuBitmaskApplier(64, 2)
    applier.host_masks(2).copy_(torch.tensor([[1, 0], [0, 1]], dtype=torch.int32))
    logits = torch.zeros(2, 64)
    applier.apply(logits, 0)
    assert [torch.isfinite(row).nonzero().flatten().tolist() for row in logits] == [[0], [32]]
