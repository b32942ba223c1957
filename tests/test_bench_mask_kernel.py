"""The kernel benchmark's ``--variant`` syntax: each field reaches the applier it builds."""

from __future__ import annotations

import pytest

from backend.kernels.cuda_masking import (
    FLAT_MAX_BYTES,
    GROUP_MASK_BYTES,
    THREADS_PER_BLOCK,
    WORDS_MAX_BYTES,
    LaunchPlan,
)
from bench.mask_kernel import Variant, parse_variant


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("w1:1", Variant("w1", 1.0, ())),
        (
            "read:auto:LLGT_MIXED_SCATTER=0,LLGT_FLAT_SCATTER=0",
            Variant("read", None, ("LLGT_MIXED_SCATTER=0", "LLGT_FLAT_SCATTER=0")),
        ),
        ("flat24:auto::24", Variant("flat24", None, (), 24 << 20)),
        ("t128:0.5:::128", Variant("t128", 0.5, (), FLAT_MAX_BYTES, 128)),
        ("s0:auto::::0", Variant("s0", None, (), FLAT_MAX_BYTES, THREADS_PER_BLOCK, 0)),
        ("s64:auto::::64", Variant("s64", None, (), FLAT_MAX_BYTES, THREADS_PER_BLOCK, 64 << 20)),
        ("w0:auto::0:::0", Variant("w0", None, (), 0, THREADS_PER_BLOCK, None, 0)),
        ("v1:auto::::::1", Variant("v1", None, (), FLAT_MAX_BYTES, THREADS_PER_BLOCK, None, WORDS_MAX_BYTES, 1)),
        (
            "g8:auto:::::::8",
            Variant("g8", None, (), FLAT_MAX_BYTES, THREADS_PER_BLOCK, None, WORDS_MAX_BYTES, None, 8 << 20),
        ),
        (
            "one:auto:::::::0",
            Variant("one", None, (), FLAT_MAX_BYTES, THREADS_PER_BLOCK, None, WORDS_MAX_BYTES, None, None),
        ),
        (
            "sparse:0.5::::::::sparse",
            Variant(
                "sparse",
                0.5,
                (),
                FLAT_MAX_BYTES,
                THREADS_PER_BLOCK,
                None,
                WORDS_MAX_BYTES,
                None,
                GROUP_MASK_BYTES,
                LaunchPlan.SPARSE,
            ),
        ),
    ],
)
def test_a_variant_names_its_build_and_launch(text: str, expected: Variant) -> None:
    assert parse_variant(text) == expected


def test_unset_fields_keep_the_defaults_of_the_kernel_it_is_compared_with() -> None:
    variant = parse_variant("plain:auto")
    fields = (variant.flat_max_bytes, variant.chunk_threads, variant.scatter16_max_bytes, variant.words_max_bytes)
    assert (*fields, variant.flat_per_thread, variant.group_mask_bytes, variant.plan) == (
        FLAT_MAX_BYTES,
        THREADS_PER_BLOCK,
        None,  # the device's L2 size, as the default applier
        WORDS_MAX_BYTES,
        None,  # by launch size, as the default applier
        GROUP_MASK_BYTES,
        None,  # by a sample of each step's masks, as the default applier
    )
