"""The mask kernel's launch policy, on the CPU: which kernel, grid and plan a step takes (the GPU tests
check that each of them masks bit for bit)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.kernels.catalog import KERNELS, SCAN_KERNELS, Family, named
from backend.kernels.launch_policy import (
    FLAT_MAX_BYTES,
    GROUP_MASK_BYTES,
    DeviceFacts,
    LaunchPlan,
    LaunchPolicy,
    PolicySettings,
)
from backend.kernels.mask_probe import DENSE, PATCHY, REFUSED, SPARSE

# An H100's facts: 132 SMs, 50 MiB of L2, and (as its driver reports for 256-thread blocks) 8 blocks of
# each scan kernel per SM.
H100 = DeviceFacts(sms=132, l2_bytes=50 << 20, scan_resident_blocks=dict.fromkeys(SCAN_KERNELS, 132 * 8))
VOCAB = 128256


def policy(vocab: int = VOCAB, **settings: object) -> LaunchPolicy:
    return LaunchPolicy(vocab, H100, PolicySettings(**settings))  # type: ignore[arg-type]


def never(rows: int, refused_from: int | None) -> str:
    raise AssertionError("the sample was read for a launch with one layout")


@pytest.mark.parametrize(
    ("dtype", "rows", "kernel"),
    [
        (torch.float32, 1, "flat_f32_v4"),  # a small launch: a vector per thread
        (torch.float32, 12, "flat_f32_v4_x2"),  # most of a wave of one-vector blocks: two vectors
        (torch.bfloat16, 8, "flat_bf16_v8"),
        (torch.bfloat16, 64, "words_bf16"),  # 16 MiB: a warp per chunk, every chunk at once
        (torch.bfloat16, 128, "mask_bf16_v8_scatter"),  # fits in L2: mixed vectors scattered into
        (torch.bfloat16, 1024, "mask_bf16_v8"),  # larger than L2: read, select, write back
        (torch.float32, 64, "mask_f32_v4"),
    ],
)
def test_the_kernel_follows_the_launch_size(dtype: torch.dtype, rows: int, kernel: str) -> None:
    assert policy().kernel(dtype, aligned=True, rows=rows) is named(kernel)


def test_unaligned_rows_take_their_own_kernel() -> None:
    unaligned = policy().kernel(torch.bfloat16, aligned=False, rows=1024)
    assert unaligned is named("mask_bf16_v1") and not unaligned.aligned
    with pytest.raises(ValueError, match="no mask kernel"):
        policy().kernel(torch.int32, aligned=True, rows=1)


def test_one_record_per_kernel_names_its_dtype_and_layout() -> None:
    """The table holds each kernel once, and each record's dtype and layout are its build's, not
    read out of its name (the names only follow a convention the .cu file keeps)."""
    assert len({kernel.name for kernel in KERNELS}) == len(KERNELS)
    assert {kernel.dtype for kernel in KERNELS} == {torch.float32, torch.float16, torch.bfloat16}
    assert named("flat_f32_v4_x2").per_thread == 2 and named("flat_f32_v4_x2").family is Family.FLAT
    assert named("mask_f16_v8_scatter").scatter and not named("mask_f16_v8").scatter
    assert all(kernel.family is Family.SCAN for kernel in SCAN_KERNELS)
    assert not any(kernel.name.startswith("naive") for kernel in KERNELS)  # benchmark-only: bench/plain_kernel.py


def test_the_plan_comes_from_the_sample_unless_forced() -> None:
    asked: list[tuple[int, int | None]] = []

    def sample(rows: int, refused_from: int | None) -> str:
        asked.append((rows, refused_from))
        return SPARSE

    assert policy().plan(named("mask_bf16_v8"), 1024, sample) == SPARSE
    assert policy().plan(named("flat_bf16_v8"), 8, sample) == SPARSE
    assert asked == [(1024, None), (8, 12)]  # only the 16-bit small launch has a refused plan there
    assert policy().plan(named("words_bf16"), 64, never) is None  # one layout, whatever the masks
    assert policy(plan=LaunchPlan.SPARSE).plan(named("mask_bf16_v8"), 1024, never) == SPARSE
    # forced to the refused plan, a launch that has none takes the dense one
    assert policy(plan=LaunchPlan.REFUSED).plan(named("mask_bf16_v8"), 1024, never) == DENSE
    assert policy(plan=LaunchPlan.REFUSED).plan(named("flat_bf16_v8"), 8, never) == REFUSED


def test_a_sparse_launch_reads_the_masks_as_one_array_when_they_lie_back_to_back() -> None:
    launch = policy().launch(named("mask_bf16_v8"), 1024, SPARSE)
    assert (launch.kernel.name, launch.rows, launch.plan) == ("scan_bf16_v8", 1, LaunchPlan.SPARSE)
    assert 1 <= launch.blocks <= H100.scan_resident_blocks[named("scan_bf16_v8")]
    strided = policy().launch(named("mask_bf16_v8"), 1024, SPARSE, masks_back_to_back=False)
    assert (strided.kernel.name, strided.rows) == ("mask_bf16_v8", 1024)  # the chunked kernel, row by row


def test_refused_and_patchy_plans_resolve_to_their_kernels() -> None:
    assert policy().launch(named("flat_bf16_v8"), 8, REFUSED).kernel.name == "flat_bf16_v8_scatter"
    assert policy().launch(named("mask_f32_v4"), 16, REFUSED).kernel.name == "flat_f32_v4_x2"
    patchy = policy().launch(named("mask_bf16_v8"), 64, PATCHY)  # 16 MiB: mask_by_word
    assert (patchy.kernel.name, patchy.plan) == ("words_bf16", None)
    assert policy().launch(named("flat_bf16_v8"), 8, SPARSE).kernel.name == "words_bf16"


def test_a_dense_launch_with_many_masks_runs_as_row_groups() -> None:
    words = (VOCAB + 31) // 32
    rows = 2 * (GROUP_MASK_BYTES // (words * 4)) + 5
    launch = policy().launch(named("mask_f32_v4"), rows, DENSE)
    assert [first for first, _ in launch.groups] == [0, launch.groups[0][1], 2 * launch.groups[0][1]]
    assert sum(count for _, count in launch.groups) == rows
    assert max(count for _, count in launch.groups) * words * 4 <= GROUP_MASK_BYTES
    assert not policy(group_mask_bytes=None).launch(named("mask_f32_v4"), rows, DENSE).groups


def test_a_large_dense_launch_prefetches_its_masks() -> None:
    rows = (160 << 20) // (VOCAB * 4) + 1  # over 128 MiB of fp32 logits, under 16 MiB of masks
    assert policy().launch(named("mask_f32_v4"), rows, DENSE).prefetch
    assert not policy().launch(named("mask_f32_v4"), rows, SPARSE).prefetch
    assert not policy().launch(named("mask_f32_v4"), 8, DENSE).prefetch


def test_fp32_small_launches_just_over_a_wave_have_a_refused_plan_of_one_vector() -> None:
    one_wave = policy(vocab=151936).flat_rows_within(named("flat_f32_v4"), 1.0)
    band_end = policy(vocab=151936).flat_rows_within(named("flat_f32_v4"), 1.5)
    assert 0 < one_wave < band_end and (band_end + 1) * 151936 * 4 <= FLAT_MAX_BYTES
    refused_from: list[int | None] = []

    def sample(rows: int, refused: int | None) -> str:
        refused_from.append(refused)
        return DENSE

    for rows in (one_wave, one_wave + 1, band_end + 1):
        policy(vocab=151936).plan(named("flat_f32_v4_x2"), rows, sample)
    assert refused_from == [None, 12, None]
    assert policy(vocab=151936).launch(named("flat_f32_v4_x2"), one_wave + 1, REFUSED).kernel.name == "flat_f32_v4"


def test_settings_are_checked_and_launches_are_frozen_records_worked_out_once() -> None:
    with pytest.raises(ValueError, match="flat_threads"):
        policy(flat_threads=48)
    with pytest.raises(ValueError, match="flat_per_thread"):
        policy(flat_per_thread=3)
    made = policy()
    launch = made.launch(named("mask_bf16_v8"), 1024, DENSE)
    assert made.launch(named("mask_bf16_v8"), 1024, DENSE) is launch
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.kernel = named("mask_f32_v4")  # type: ignore[misc]
