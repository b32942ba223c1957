"""The L2 read sweep's layouts and summary (the kernels themselves run on the GPU machine)."""

from __future__ import annotations

import pytest

from bench.l2_read import Layout, layouts, summary


def test_every_layout_reads_the_whole_array_in_one_round_of_loads() -> None:
    """Each thread's loads, over the grid, cover every vector of the array, and one block fewer would not."""
    for layout in layouts([4_096_000, 16_384_000, 4000, 16], loads=[1, 3, 16], threads=[32, 256, 1024]):
        covered = layout.blocks * layout.threads * layout.loads
        assert covered >= layout.vectors
        assert layout.blocks == 1 or (layout.blocks - 1) * layout.threads * layout.loads < layout.vectors


def test_an_array_that_is_not_a_whole_number_of_vectors_gets_a_last_partial_one() -> None:
    assert Layout(bytes=20, vector_bytes=16, loads=1, threads=32).vectors == 2
    assert Layout(bytes=16, vector_bytes=16, loads=1, threads=32).blocks == 1


def test_the_summary_keeps_each_size_s_fastest_layout_and_its_rate_past_the_launch() -> None:
    rows = [
        {"bytes": 4_000_000, "loads": 1, "us": 2.0},
        {"bytes": 4_000_000, "loads": 8, "us": 1.5},
        {"bytes": 16_000_000, "loads": 4, "us": 3.0},
    ]
    best = summary(rows, bare_us=1.0)
    assert best[4_000_000]["loads"] == 8
    assert best[4_000_000]["tb_per_s_past_launch"] == pytest.approx(8.0)  # 4 MB in 0.5 us
    assert best[16_000_000]["tb_per_s_past_launch"] == pytest.approx(8.0)
    assert list(best) == [4_000_000, 16_000_000]
