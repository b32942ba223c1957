"""The host-side sample that picks the launch plan of chunked and small launches (no GPU needed)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from backend.kernels.catalog import named
from backend.kernels.launch_policy import (
    MID_REFUSED_FROM,
    PATCHY_DENSE_MAX_CHUNKS,
    PATCHY_WORDS_MAX_BYTES,
    SCAN_WARP_PIECES,
    patchy_launch,
    scan_blocks,
)
from backend.kernels.mask_probe import DENSE, PATCHY, REFUSED, REFUSED_FROM, SAMPLED_RUNS, SPARSE, MaskDensityProbe

WORDS = (128256 + 31) // 32
MAX_ROWS = 300


def probe_over(masks: npt.NDArray[np.int32]) -> MaskDensityProbe:
    return MaskDensityProbe(masks.reshape(-1), masks.shape[1])


@pytest.mark.parametrize("refused_from", [REFUSED_FROM, 1, None])
def test_masks_that_allow_everything_are_sparse(refused_from: int | None) -> None:
    probe = probe_over(np.full((MAX_ROWS, WORDS), -1, dtype=np.int32))
    assert probe.plan(MAX_ROWS, refused_from) == SPARSE and probe.plan(1, refused_from) == SPARSE


def test_forced_tokens_are_refused_where_the_launch_can_take_that_plan_and_dense_elsewhere() -> None:
    """A grammar state that admits one token (a colon after a key) refuses nearly every run."""
    masks = np.zeros((MAX_ROWS, WORDS), dtype=np.int32)
    masks[np.arange(MAX_ROWS), np.arange(MAX_ROWS) % WORDS] = 1 << 5  # one token a row
    probe = probe_over(masks)
    assert (
        probe.plan(MAX_ROWS, refused_from=REFUSED_FROM) == REFUSED
        and probe.plan(1, refused_from=REFUSED_FROM) == REFUSED
    )
    assert probe.plan(MAX_ROWS, refused_from=None) == DENSE and probe.plan(1, refused_from=None) == DENSE


@pytest.mark.parametrize("refused_from", [REFUSED_FROM, 1, None])
def test_random_masks_are_dense(refused_from: int | None) -> None:
    rng = np.random.default_rng(0)
    masks = rng.integers(-(2**31), 2**31, size=(64, WORDS), dtype=np.int64).astype(np.int32)
    assert probe_over(masks).plan(64, refused_from) == DENSE


def test_a_string_state_that_refuses_a_few_tokens_all_over_the_vocabulary_is_dense() -> None:
    """Inside a JSON string every token but those with a quote, a backslash or a control character
    may come: about 2% refused, spread over the vocabulary, so hardly a chunk of 1024 tokens allows
    everything and the kernel writes into every one (the dense plan was 1.01-1.21x faster there)."""
    rng = np.random.default_rng(1)
    masks = np.full((256, WORDS), -1, dtype=np.int32)
    refused = rng.integers(0, WORDS * 32, size=(256, WORDS * 32 // 50))
    bits = (~(np.int64(1) << (refused & 31))).astype(np.int32)
    np.bitwise_and.at(masks, (np.arange(256)[:, None], refused >> 5), bits)
    assert (masks != -1).mean() > 0.4  # about half the words refuse a token
    assert probe_over(masks).plan(256, refused_from=REFUSED_FROM) == DENSE


def test_a_row_that_refuses_a_few_neighbouring_tokens_is_patchy() -> None:
    """Refused tokens in one stretch of the vocabulary leave the other chunks to be skipped: the
    sample meets the stretch, and most of it allows everything."""
    masks = np.full((8, WORDS), -1, dtype=np.int32)
    masks[:, :40] = 0
    assert probe_over(masks).plan(8, refused_from=REFUSED_FROM) == PATCHY


def test_a_batch_with_a_few_constrained_rows_is_patchy_when_the_sample_meets_one() -> None:
    """One row in eight refuses tokens all over the vocabulary (inside a JSON string), the others
    allow everything: an eighth of the sampled runs fall in the constrained rows."""
    masks = np.full((256, WORDS), -1, dtype=np.int32)
    masks[::8] = 0x7FFF_FFFF  # every 32nd token refused
    assert probe_over(masks).plan(256, refused_from=REFUSED_FROM) == PATCHY
    masks[::8] = -1
    assert probe_over(masks).plan(256, refused_from=REFUSED_FROM) == SPARSE


@pytest.mark.parametrize(
    ("allowing_rows", "refused_from", "expected"),
    [(4, REFUSED_FROM, SPARSE), (2, REFUSED_FROM, DENSE), (0, REFUSED_FROM, REFUSED), (2, MID_REFUSED_FROM, REFUSED)],
)
def test_a_mixed_batch_takes_a_one_sided_plan_only_when_enough_rows_are_one_sided(
    allowing_rows: int, refused_from: int, expected: str
) -> None:
    """Rows that allow everything among rows that allow nothing, interleaved (4 of 4 allowing: all).
    Half and half is dense where the refused plan needs nearly every run to allow nothing (16-bit
    small launches), refused where it needs a quarter (mid-size fp32 launches)."""
    masks = np.zeros((256, WORDS), dtype=np.int32)
    for first in range(allowing_rows):
        masks[first::4] = -1
    assert probe_over(masks).plan(256, refused_from=refused_from) == expected


@pytest.mark.parametrize("rows", [64, 256, 1000, 4096])
@pytest.mark.parametrize("period", [2, 4])
def test_a_pattern_that_repeats_every_few_rows_is_sampled_at_every_phase(rows: int, period: int) -> None:
    """Rows that alternate (say, a request with two beams, one of them in a string) must not all be
    sampled at the same phase of the pattern."""
    probe = MaskDensityProbe(np.zeros(rows * WORDS, dtype=np.int32), WORDS)
    phases = [position * 2 // WORDS % period for position in probe.positions(rows)]
    assert all(phases.count(phase) >= SAMPLED_RUNS // period // 2 for phase in range(period))


def test_only_the_steps_rows_are_sampled() -> None:
    """Rows past this step's (left over from a larger one) do not count."""
    masks = np.full((MAX_ROWS, WORDS), -1, dtype=np.int32)
    masks[:10] = 0
    assert probe_over(masks).plan(10, refused_from=REFUSED_FROM) == REFUSED
    masks[:10] = 0x5555_5555
    assert probe_over(masks).plan(10, refused_from=REFUSED_FROM) == DENSE


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, MAX_ROWS), words=st.integers(1, WORDS))
@example(rows=3, words=1)  # three words, one whole int64: the later stretches' samples are all clamped to it
def test_each_sample_lies_in_its_own_stretch_of_the_rows_and_inside_them(rows: int, words: int) -> None:
    probe = MaskDensityProbe(np.zeros(MAX_ROWS * words, dtype=np.int32), words)
    if rows * words < 2:
        return
    positions = probe.positions(rows)
    assert len(positions) == SAMPLED_RUNS
    # The row of the last int64 wholly inside the rows: a sample past it is moved back to it.
    last_row = 2 * (rows * words // 2 - 1) // words
    for i, position in enumerate(positions):
        assert position >= 0 and 2 * position + 1 < rows * words  # both words inside the step's rows
        row = 2 * position // words
        assert min(i * rows // SAMPLED_RUNS - 1, last_row) <= row <= (i + 1) * rows // SAMPLED_RUNS


def test_a_single_word_of_masks_is_dense() -> None:
    probe = MaskDensityProbe(np.full(1, -1, dtype=np.int32), 1)
    assert probe.plan(1, refused_from=REFUSED_FROM) == DENSE
    with pytest.raises(ValueError, match="no whole run"):
        probe.positions(1)


def test_more_rows_than_the_buffer_holds_are_refused() -> None:
    probe = MaskDensityProbe(np.zeros(4 * WORDS, dtype=np.int32), WORDS)
    with pytest.raises(ValueError, match="do not fit"):
        probe.plan(5, refused_from=REFUSED_FROM)


# (kernel, rows, vocab) -> (kernel, plan) of a patchy step, as the applier resolves it.
PATCHY_CASES = {
    "small fp32 launches keep their kernel, which scatters without reading": (
        ("flat_f32_v4_x2", 8, 151936),
        ("flat_f32_v4_x2", DENSE),
    ),
    "small 16-bit launches take the kernel that never reads a logit": (
        ("flat_bf16_v8", 64, 32000),
        ("flat_bf16_v8_scatter", DENSE),
    ),
    "small 16-bit launches of more rows keep the sparse plan's warp per chunk": (
        ("flat_f16_v8", 65, 32000),
        ("flat_f16_v8", SPARSE),
    ),
    "16-bit launches up to the limit take a warp per chunk": (
        ("mask_bf16_v8", PATCHY_WORDS_MAX_BYTES // (2 * 128256), 128256),
        ("words_bf16", None),
    ),
    "16-bit launches past it keep the sparse plan's kernel, a piece per warp": (
        ("mask_f16_v8", PATCHY_WORDS_MAX_BYTES // (2 * 128256) + 1, 128256),
        ("mask_f16_v8", PATCHY),
    ),
    "fp32 launches of few chunks take the dense plan": (
        ("mask_f32_v4", PATCHY_DENSE_MAX_CHUNKS // 32, 32000),
        ("mask_f32_v4", DENSE),
    ),
    "fp32 launches of more chunks keep the sparse plan's kernel, a piece per warp": (
        ("mask_f32_v4", PATCHY_DENSE_MAX_CHUNKS // 32 + 1, 32000),
        ("mask_f32_v4", PATCHY),
    ),
    "unaligned rows keep the sparse plan's layout": (("mask_bf16_v1", 256, 32001), ("mask_bf16_v1", PATCHY)),
}


@pytest.mark.parametrize("case", PATCHY_CASES)
def test_a_patchy_step_gives_constrained_chunks_their_own_warps_up_to_a_size(case: str) -> None:
    (name, rows, vocab), (expected_name, expected_plan) = PATCHY_CASES[case]
    kernel, plan = patchy_launch(named(name), rows, vocab, scatter_max_rows=64)
    assert (kernel.name, plan) == (expected_name, expected_plan)


# The H100's scan_f32_v4: 4 blocks of 8 warps on each of 132 SMs.
RESIDENT = 4 * 132


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (1, 1),  # one block, however few pieces
        (8 * SCAN_WARP_PIECES, 1),  # each of a block's warps takes a full round
        (8 * SCAN_WARP_PIECES + 1, 2),
        (4000, 63),  # 256 x 32k fp32 (1 MB of masks): 63 blocks, not 500
        (RESIDENT * 8 * SCAN_WARP_PIECES, RESIDENT),
        (RESIDENT * 8 * SCAN_WARP_PIECES * 10, RESIDENT),  # past one round for every resident warp: rounds
    ],
)
def test_the_sparse_kernel_takes_the_fewest_blocks_that_read_its_masks_in_one_round(pieces: int, expected: int) -> None:
    assert scan_blocks(pieces, 8, RESIDENT) == expected


def test_one_piece_per_warp_is_the_grid_before_rounds() -> None:
    """The layout the benchmark's comparisons can ask for: as many warps as pieces, up to all resident."""
    assert scan_blocks(4000, 8, RESIDENT, warp_pieces=1) == 500
    assert scan_blocks(10**6, 8, RESIDENT, warp_pieces=1) == RESIDENT
