"""Plot ``mask_kernel.json`` (from ``bench/gpu_kernel.sh``) and print it as a markdown table.

.venv/bin/python -m bench.plot_mask_kernel docs/results/mask_kernel.json docs/mask_kernel.png
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SERIES = [
    ("ours_us", "llgtriton (PyCUDA)", "tab:blue"),
    ("xgrammar_cuda_us", "xgrammar CUDA", "tab:orange"),
    ("xgrammar_triton_us", "xgrammar Triton", "tab:green"),
    ("plain_us", "one thread per logit", "tab:gray"),
    ("torch_us", "torch reference", "tab:red"),
    ("floor_us", "bandwidth floor (nominal)", "black"),
    ("achievable_us", "bandwidth floor (as torch's fill_/neg_ sustain)", "dimgray"),
]
KINDS = {
    "all": "all allowed",
    "half": "50% random",
    "one": "1 token allowed",
    "mixed": "half the rows all allowed, half 1 token",
    "string": "all but 2% (a JSON string)",
    "tenth": "every tenth row a JSON string, the rest all allowed",
    "few": "a tenth of the rows, at random, a JSON string, the rest all allowed",
}


def _us(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.1f}" if key in row else "n/a"


def _range(values: Iterable[float]) -> str:
    """``min-max`` of ``values``, two decimals; n/a when there are none."""
    listed = list(values)
    return f"{min(listed):.2f}-{max(listed):.2f}" if listed else "n/a"


def _planned_host_line(rows: list[dict[str, Any]]) -> list[str]:
    """What sampling the masks for the launch plan costs the host (reports from before it: nothing)."""
    if not all("host_planned_us" in r for r in rows):
        return []
    extra = {
        batch: statistics.median(r["host_us"] - r["host_planned_us"] for r in rows if r["batch"] == batch)
        for batch in sorted({r["batch"] for r in rows})
    }
    return [
        "- host µs per step with the launch plan set beforehand instead of sampled from the masks, median:"
        f" {statistics.median(r['host_planned_us'] for r in rows):.1f}; ours minus that, median by batch: "
        + ", ".join(f"{batch}: {value:.1f}" for batch, value in extra.items())
    ]


def _busy_host_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The host times with the GPU busy, as the engine calls the post-processor (reports from before
    they were taken: nothing)."""
    if not all("host_busy_us" in r and "xgrammar_cuda_host_busy_us" in r for r in rows):
        return []
    return [
        "- host µs per step with the GPU busy (the call queued behind a running kernel, as behind the"
        f" engine's forward pass), median: ours {statistics.median(r['host_busy_us'] for r in rows):.1f};"
        f" xgrammar's op alone {statistics.median(r['xgrammar_cuda_host_busy_us'] for r in rows):.1f};"
        " ours with one tensor per request, by batch: "
        + ", ".join(
            f"{batch}: {statistics.median(r['host_rows_busy_us'] for r in rows if r['batch'] == batch):.1f}"
            for batch in sorted({r["batch"] for r in rows})
        )
    ]


def _beyond_noise(rows: list[dict[str, Any]]) -> str:
    """How many of the slower cells are slower by more than the noise of their paired timing
    (reports from before the two were timed in turn: nothing)."""
    if not all("ours_minus_xgrammar_ci_us" in r for r in rows):
        return ""
    slower = [r for r in rows if r["ours_us"] > r["xgrammar_cuda_us"]]
    beyond = sum(r["ours_us"] - r["xgrammar_cuda_us"] > r["ours_minus_xgrammar_ci_us"] for r in slower)
    return f"; of the {len(slower)} slower, {beyond} by more than the 95% interval of the paired difference"


def _floor_in_turn(large: list[dict[str, Any]]) -> str:
    """Where ours is timed alone for the floor (as torch's ops are) and in turn with xgrammar's kernel
    for the comparison, what the floor ratio is in the second timing too."""
    if not large or not all("ours_alone_us" in r for r in large):
        return ""
    return (
        " (each timed alone, call after call; ours timed in turn with xgrammar's kernel / nominal floor"
        f" {_range(r['ours_us'] / r['floor_us'] for r in large)})"
    )


def _host_cpu(report: dict[str, Any]) -> str:
    """The host's CPU, where the report names it (reports before it was recorded do not)."""
    return f" (host CPU: {report['host_cpu']})" if "host_cpu" in report else ""


def _host_cell(row: dict[str, Any]) -> str:
    idle = f"{row['host_us']:.1f} / {row['xgrammar_cuda_host_us']:.1f}"
    if "host_busy_us" not in row or "xgrammar_cuda_host_busy_us" not in row:
        return idle
    return f"{idle} (busy {row['host_busy_us']:.1f} / {row['xgrammar_cuda_host_busy_us']:.1f})"


def markdown(report: dict[str, Any]) -> str:
    """The summary against the issue's targets and the full table, as docs/kernel.md shows them."""
    rows = report["results"]
    speedups = [r["xgrammar_cuda_us"] / r["ours_us"] for r in rows]
    by_batch: dict[int, list[float]] = {}
    for row, speedup in zip(rows, speedups, strict=True):
        by_batch.setdefault(row["batch"], []).append(speedup)
    large = [r for r in rows if r["batch"] >= 1024 and r["kind"] in ("half", "one")]
    lines = [
        f"- cells at least as fast as xgrammar's CUDA kernel: {sum(s >= 1 for s in speedups)} of {len(rows)}"
        f" (worst {min(speedups):.2f}x){_beyond_noise(rows)}",
        "- median xgrammar / ours by batch: "
        + ", ".join(f"{batch}: {statistics.median(by_batch[batch]):.2f}" for batch in sorted(by_batch)),
        f"- batch >= 1024, 50% and 1 token: ours / nominal floor {_range(r['ours_vs_floor'] for r in large)};"
        " torch's fill_/neg_ / nominal floor"
        f" {_range(r['achievable_us'] / r['floor_us'] for r in large if 'achievable_us' in r)}"
        f"{_floor_in_turn(large)}",
        "- host µs per step with the GPU idle (right after a synchronise), median: ours (copy + event +"
        " launch as one graph replay)"
        f" {statistics.median(r['host_us'] for r in rows):.1f}, as three driver calls"
        f" {statistics.median(r['host_calls_us'] for r in rows):.1f}; xgrammar's op alone"
        f" {statistics.median(r['xgrammar_cuda_host_us'] for r in rows):.1f}; xgrammar's op with its mask copy"
        f" {statistics.median(r['xgrammar_cuda_copy_host_us'] for r in rows):.1f}"
        f"{_host_cpu(report)}",
        *_planned_host_line(rows),
        "- host µs per step with one tensor per request (as the engines pass rows), median by batch: "
        + ", ".join(
            f"{batch}: {statistics.median(r['host_rows_us'] for r in rows if r['batch'] == batch):.1f}"
            for batch in sorted(by_batch)
        ),
        *_busy_host_lines(rows),
        "",
        "| vocab | dtype | batch | mask | ours | xgrammar CUDA | xgrammar Triton | torch ref | 1 thread/logit"
        " | floor | floor at torch's bandwidth | ours alone / floor | xgrammar CUDA / ours | host µs ours / xgrammar |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['vocab']} | {r['dtype']} | {r['batch']} | {KINDS[r['kind']]} | {_us(r, 'ours_us')}"
            f" | {_us(r, 'xgrammar_cuda_us')} | {_us(r, 'xgrammar_triton_us')} | {_us(r, 'torch_us')}"
            f" | {_us(r, 'plain_us')} | {_us(r, 'floor_us')} | {_us(r, 'achievable_us')}"
            f" | {r['ours_vs_floor']:.2f} | {r['xgrammar_cuda_us'] / r['ours_us']:.2f}"
            f" | {_host_cell(r)} |"
        )
    return "\n".join(lines)


def main(source: Path, target: Path, vocab: int = 128256) -> None:
    # (matplotlib is the `bench` extra, imported here so that the table needs no more than the tests do)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(source.read_text())
    print(markdown(report))  # noqa: T201 - this tool's output is the table
    rows = [r for r in report["results"] if r["vocab"] == vocab]
    dtypes = sorted({r["dtype"] for r in rows}, reverse=True)
    kinds = {kind: title for kind, title in KINDS.items() if any(r["kind"] == kind for r in rows)}
    figure, axes = plt.subplots(len(dtypes), len(kinds), figsize=(5 * len(kinds), 4.5 * len(dtypes)), squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, (kind, title) in enumerate(kinds.items()):
            axis = axes[i][j]
            cells = sorted((r for r in rows if r["dtype"] == dtype and r["kind"] == kind), key=lambda r: r["batch"])
            for key, label, color in SERIES:
                if all(key in r for r in cells):
                    style = "--" if key.startswith(("floor", "achievable")) else "-o"
                    axis.plot([r["batch"] for r in cells], [r[key] for r in cells], style, label=label, color=color)
            axis.set(xscale="log", yscale="log", xlabel="batch (rows)", ylabel="µs per call")
            axis.set_title(f"{dtype}, vocab {vocab}, {title}")
            axis.grid(True, which="both", alpha=0.3)
    axes[0][min(1, len(kinds) - 1)].legend(fontsize=8)  # a 50% panel has every series
    figure.suptitle(f"Token-mask kernels on {report['device']} (kernel time from CUPTI)")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
