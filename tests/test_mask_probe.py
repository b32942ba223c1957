"""The host-side sample that picks the chunked kernel's launch plan (no GPU needed)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.kernels.mask_probe import SAMPLED_BYTES, MaskDensityProbe

WORDS = (128256 + 31) // 32
MAX_ROWS = 300


def probe_over(masks: npt.NDArray[np.int32]) -> MaskDensityProbe:
    return MaskDensityProbe(masks.reshape(-1), masks.shape[1])


def test_masks_that_allow_everything_are_mostly_allowed_and_forced_tokens_are_not() -> None:
    masks = np.full((MAX_ROWS, WORDS), -1, dtype=np.int32)
    probe = probe_over(masks)
    assert probe.mostly_allowed(MAX_ROWS) and probe.mostly_allowed(1)
    masks[:] = 0
    masks[np.arange(MAX_ROWS), np.arange(MAX_ROWS) % WORDS] = 1 << 5  # one token a row
    assert not probe.mostly_allowed(MAX_ROWS) and not probe.mostly_allowed(1)


def test_random_masks_are_not_mostly_allowed() -> None:
    rng = np.random.default_rng(0)
    masks = rng.integers(-(2**31), 2**31, size=(64, WORDS), dtype=np.int64).astype(np.int32)
    assert not probe_over(masks).mostly_allowed(64)


def test_a_string_state_that_allows_all_but_a_few_tokens_is_mostly_allowed() -> None:
    """Inside a JSON string, every token but those with a quote, a backslash or a control character
    may come: most bytes of the masks allow all their 8 tokens."""
    masks = np.full((8, WORDS), -1, dtype=np.int32)
    masks[:, ::3] = ~np.int32(1 << 7)  # every third word refuses one token
    assert probe_over(masks).mostly_allowed(8)


@pytest.mark.parametrize(("allowing_rows", "expected"), [(3, True), (1, False)])
def test_a_mixed_batch_follows_most_of_its_rows(allowing_rows: int, expected: bool) -> None:
    """Rows that allow everything among rows that force a token, interleaved: the sample follows the
    share of the rows."""
    masks = np.zeros((256, WORDS), dtype=np.int32)
    for first in range(allowing_rows):
        masks[first::4] = -1
    assert probe_over(masks).mostly_allowed(256) is expected


def test_only_the_steps_rows_are_sampled() -> None:
    """Rows past this step's (left over from a larger one) do not count."""
    masks = np.full((MAX_ROWS, WORDS), -1, dtype=np.int32)
    masks[:10] = 0
    assert not probe_over(masks).mostly_allowed(10)


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, MAX_ROWS), words=st.integers(1, WORDS))
def test_each_sample_lies_in_its_own_stretch_of_the_rows_and_of_the_vocabulary(rows: int, words: int) -> None:
    probe = MaskDensityProbe(np.zeros(MAX_ROWS * words, dtype=np.int32), words)
    positions = probe.positions(rows)
    assert len(positions) == SAMPLED_BYTES
    for i, position in enumerate(positions):
        row, word = divmod(position // 4, words)
        assert i * rows // SAMPLED_BYTES <= row <= (i + 1) * rows // SAMPLED_BYTES and row < rows
        assert i * words // SAMPLED_BYTES <= word <= (i + 1) * words // SAMPLED_BYTES and word < words


def test_more_rows_than_the_buffer_holds_are_refused() -> None:
    probe = MaskDensityProbe(np.zeros(4 * WORDS, dtype=np.int32), WORDS)
    with pytest.raises(ValueError, match="do not fit"):
        probe.mostly_allowed(5)
