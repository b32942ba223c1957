"""The kernel benchmark's ``--variant`` syntax: each field reaches the applier it builds."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from backend.kernels.launch_policy import LaunchPlan, PolicySettings
from bench.mask_kernel import (
    MASK_KINDS,
    DeviceEvent,
    Variant,
    floor_us,
    main,
    make_masks,
    pair_times,
    parse_variant,
)
from bench.plot_mask_kernel import KINDS, markdown
from tests.support.harness import ROOT


def h100_report() -> dict[str, Any]:
    """The committed H100 kernel report (a fresh copy per call: tests relabel its rows)."""
    report: dict[str, Any] = json.loads((ROOT / "docs/results/mask_kernel_h100.json").read_text())
    return report


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("w1:1", Variant("w1", (), PolicySettings(waves=1.0))),
        ("ft128:auto:::::::::128", Variant("ft128", (), PolicySettings(flat_threads=128))),
        ("sp1:auto::::::::::1", Variant("sp1", (), PolicySettings(scan_warp_pieces=1))),
        (
            "read:auto:LLGT_MIXED_SCATTER=0,LLGT_FLAT_SCATTER=0",
            Variant("read", ("LLGT_MIXED_SCATTER=0", "LLGT_FLAT_SCATTER=0")),
        ),
        ("flat24:auto::24", Variant("flat24", (), PolicySettings(flat_max_bytes=24 << 20))),
        ("t128:0.5:::128", Variant("t128", (), PolicySettings(waves=0.5, chunk_threads=128))),
        ("s0:auto::::0", Variant("s0", (), PolicySettings(scatter16_max_bytes=0))),
        ("s64:auto::::64", Variant("s64", (), PolicySettings(scatter16_max_bytes=64 << 20))),
        ("w0:auto::0:::0", Variant("w0", (), PolicySettings(flat_max_bytes=0, words_max_bytes=0))),
        ("v1:auto::::::1", Variant("v1", (), PolicySettings(flat_per_thread=1))),
        ("g8:auto:::::::8", Variant("g8", (), PolicySettings(group_mask_bytes=8 << 20))),
        ("one:auto:::::::0", Variant("one", (), PolicySettings(group_mask_bytes=None))),
        ("sparse:0.5::::::::sparse", Variant("sparse", (), PolicySettings(waves=0.5, plan=LaunchPlan.SPARSE))),
    ],
)
def test_a_variant_names_its_build_and_launch(text: str, expected: Variant) -> None:
    assert parse_variant(text) == expected


def test_unset_fields_keep_the_defaults_of_the_kernel_it_is_compared_with() -> None:
    assert parse_variant("plain:auto") == Variant("plain", (), PolicySettings())


def test_an_unknown_mask_kind_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--kinds", "all", "halve"])
    assert exited.value.code == 2
    assert "invalid choice: 'halve'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_every_mask_kind_has_masks_and_a_floor(kind: str) -> None:
    vocab = 1000
    masks = make_masks(kind, 4, vocab, torch.Generator().manual_seed(0))
    allowed = [sum(bin(word & 0xFFFFFFFF).count("1") for word in row) for row in masks.tolist()]
    expected = {
        "all": [32 * masks.shape[1]] * 4,
        "one": [1] * 4,
        "mixed": [32 * masks.shape[1], 1] * 2,
    }
    if kind in expected:
        assert allowed == expected[kind]
    elif kind == "string":
        assert all(32 * masks.shape[1] - vocab // 50 <= a < 32 * masks.shape[1] for a in allowed)
    elif kind == "tenth":  # row 0 is a string's, rows 1-3 allow everything
        assert 32 * masks.shape[1] - vocab // 50 <= allowed[0] < 32 * masks.shape[1]
        assert allowed[1:] == [32 * masks.shape[1]] * 3
    elif kind == "few":  # one row of four, any, is a string's
        assert sorted(allowed)[1:] == [32 * masks.shape[1]] * 3
        assert 32 * masks.shape[1] - vocab // 50 <= min(allowed) < 32 * masks.shape[1]
    else:  # half: random bits
        assert all(0.4 < a / (32 * masks.shape[1]) < 0.6 for a in allowed)
    assert floor_us(kind, 4, vocab, torch.float32, 3.35e12) > 0


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_every_mask_kind_prints_in_the_report_table(kind: str) -> None:
    """A report of any kind the benchmark measures must render (a kind without a title crashed the
    table with a KeyError). The row is a real report's, relabelled."""
    report = h100_report()
    row = report["results"][0] | {"kind": kind, "ours_us": 1.0}
    table = markdown(report | {"results": [row]})
    assert f"| {row['vocab']} | {row['dtype']} | {row['batch']} | {KINDS[kind]} | 1.0 |" in table


def test_busy_host_times_print_beside_the_idle_ones_when_the_report_has_them() -> None:
    """Reports from before the busy-GPU host times render as they did; newer ones show both."""
    report = h100_report()
    row = {key: value for key, value in report["results"][0].items() if "busy" not in key}
    assert "busy" not in markdown(report | {"results": [row]})
    busy = row | {"host_busy_us": 4.3, "host_rows_busy_us": 6.5, "xgrammar_cuda_host_busy_us": 7.0}
    table = markdown(report | {"results": [busy]})
    assert "(busy 4.3 / 7.0) |" in table
    by_batch = f"ours with one tensor per request, by batch: {row['batch']}: 6.5"
    assert f"median: ours 4.3; xgrammar's op alone 7.0; {by_batch}" in table


def test_paired_calls_are_split_by_kernel_name_into_per_call_times() -> None:
    """Two launches timed in turn: each call's time is the sum of its own kernels (a call of several
    launches, such as row groups, counts once), and the interval of the mean difference is wider
    when the calls' differences vary."""
    events = []
    for call in range(4):
        start = call * 10.0
        events += [
            DeviceEvent("ours_group", start, 1.0),
            DeviceEvent("ours_group", start + 1, 1.0 + call / 10),
            DeviceEvent("LogitsBitmaskKernel", start + 3, 2.5),
        ]
    paired = pair_times(events, frozenset({"ours_group"}), frozenset({"LogitsBitmaskKernel"}), 4)
    assert paired.first_us == pytest.approx(2.15)
    assert paired.second_us == pytest.approx(2.5)
    steady = [DeviceEvent(e.name, e.start_us, 1.0 if e.name == "ours_group" else 2.5) for e in events]
    assert pair_times(steady, frozenset({"ours_group"}), frozenset({"LogitsBitmaskKernel"}), 4).difference_ci_us == 0
    assert paired.difference_ci_us > 0


def test_paired_calls_whose_events_do_not_split_evenly_are_refused() -> None:
    """A kernel that ran in only some calls would misassign time between calls: refused."""
    events = [DeviceEvent("ours", 0.0, 1.0), DeviceEvent("xgr", 1.0, 1.0), DeviceEvent("xgr", 2.0, 1.0)]
    with pytest.raises(RuntimeError, match="not as many per call"):
        pair_times(events, frozenset({"ours"}), frozenset({"xgr"}), 2)


def test_slower_cells_are_told_apart_from_ties_within_the_paired_noise() -> None:
    """With paired timings, the summary says how many slower cells are slower beyond their noise."""
    report = h100_report()
    row = report["results"][0]
    before = {key: value for key, value in row.items() if key != "ours_minus_xgrammar_ci_us"}
    assert "paired difference" not in markdown(report | {"results": [before]})  # a report from before it
    cells = [
        row | {"ours_us": 1.00, "xgrammar_cuda_us": 1.10, "ours_minus_xgrammar_ci_us": 0.01},  # faster
        row | {"ours_us": 1.02, "xgrammar_cuda_us": 1.01, "ours_minus_xgrammar_ci_us": 0.02},  # a tie
        row | {"ours_us": 1.20, "xgrammar_cuda_us": 1.10, "ours_minus_xgrammar_ci_us": 0.02},  # slower
    ]
    summary = markdown(report | {"results": cells})
    assert "at least as fast as xgrammar's CUDA kernel: 1 of 3 (worst 0.92x); of the 2 slower, 1 by more" in summary


def test_the_floor_ratio_in_turn_with_xgrammar_prints_beside_the_one_timed_alone() -> None:
    """Ours is timed alone for the floor (as torch's ops are); the summary also gives the ratio of
    the timing in turn with xgrammar's kernel, so neither hides the other."""
    report = h100_report()
    large = next(r for r in report["results"] if r["batch"] >= 1024 and r["kind"] == "one")
    row = large | {"floor_us": 100.0, "ours_alone_us": 110.0, "ours_vs_floor": 1.1, "ours_us": 116.0}
    summary = markdown(report | {"results": [row]})
    assert "ours / nominal floor 1.10-1.10;" in summary
    assert "ours timed in turn with xgrammar's kernel / nominal floor 1.16-1.16)" in summary


def test_the_host_cpu_prints_beside_the_host_times_when_the_report_names_it() -> None:
    """Host times follow the host's CPU, so a report that names it says so beside them; reports from
    before it was recorded render as they did."""
    report = h100_report()
    assert "host CPU" not in markdown(report)
    summary = markdown(report | {"host_cpu": "Example CPU 9000"})
    host_line = next(line for line in summary.splitlines() if line.startswith("- host µs per step with the GPU idle"))
    assert host_line.endswith("(host CPU: Example CPU 9000)")
