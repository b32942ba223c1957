"""The addresses the mask kernel reads, from shapes and strides (CPU tensors stand in for CUDA ones)."""

from __future__ import annotations

import pytest
import torch

from backend.kernels.row_addresses import request_rows, tensor_rows


def test_all_rows_of_a_step_are_evenly_spaced_from_the_first() -> None:
    logits = torch.zeros(4, 64)
    rows = tensor_rows(logits, 64, device="cpu")
    assert rows.count == 4
    assert (rows.base, rows.stride) == (logits.data_ptr(), 64)
    assert rows.pointers.tolist() == [logits[i].data_ptr() for i in range(4)]


def test_chosen_rows_keep_their_order_and_their_own_addresses() -> None:
    logits = torch.zeros(6, 64)
    uneven = tensor_rows(logits, 64, [5, 0, 2], device="cpu")
    assert uneven.pointers.tolist() == [logits[i].data_ptr() for i in (5, 0, 2)]
    assert uneven.stride == 0  # not evenly spaced: the kernel reads the pointers
    even = tensor_rows(logits, 64, [1, 3, 5], device="cpu")
    assert (even.base, even.stride) == (logits[1].data_ptr(), 128)
    single = tensor_rows(logits, 64, [4], device="cpu")
    assert (single.base, single.count) == (logits[4].data_ptr(), 1)


def test_a_padded_vocabulary_view_needs_no_copy() -> None:
    padded = torch.zeros(2, 3, 72)  # [batch, beams, vocab_padded]
    rows = tensor_rows(padded[..., :64], 64, device="cpu")
    assert rows.pointers.tolist() == [padded[b, k].data_ptr() for b in range(2) for k in range(3)]
    assert rows.stride == 72


def test_alignment_is_every_row_on_16_bytes() -> None:
    assert tensor_rows(torch.zeros(3, 64), 64, device="cpu").aligned
    assert not tensor_rows(torch.zeros(3, 66)[:, 1:65], 64, device="cpu").aligned


@pytest.mark.parametrize(
    ("logits", "rows", "message"),
    [
        (torch.zeros(2, 63), None, r"\[\.\.\., 64\]"),
        (torch.zeros(64, 2).t(), None, "unit stride"),
        (torch.zeros(2, 64), [2], r"\[0, 2\)"),
        (torch.zeros(2, 64), [-1], r"\[0, 2\)"),
    ],
)
def test_a_tensor_the_kernel_would_mask_wrongly_is_refused(
    logits: torch.Tensor, rows: list[int] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        tensor_rows(logits, 64, rows, device="cpu")


def test_a_cpu_tensor_is_refused_where_the_kernel_runs() -> None:
    with pytest.raises(ValueError, match="cuda tensor"):
        tensor_rows(torch.zeros(2, 64), 64)
    with pytest.raises(ValueError, match="cuda tensor"):
        request_rows([torch.zeros(1, 64)], 64)


def test_request_rows_are_read_from_each_tensor() -> None:
    step = torch.zeros(3, 64)
    rows = request_rows([step[2].view(1, 1, 64), step[0].view(1, 1, 64)], 64, device="cpu")
    assert rows.pointers.tolist() == [step[2].data_ptr(), step[0].data_ptr()]


def test_a_request_tensor_of_several_rows_is_refused() -> None:
    with pytest.raises(ValueError, match=r"row 0 must be one row of 64 logits"):
        request_rows([torch.zeros(1, 2, 64)], 64, device="cpu")
