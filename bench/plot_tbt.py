"""Plot a ``tbt_overhead_*.json`` report: throughput and time between tokens against batch size.

.venv/bin/python -m bench.plot_tbt docs/results/tbt_overhead_cuda.json docs/tbt_overhead_cuda.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SIDES = [("unconstrained", "unconstrained", "tab:gray"), ("constrained", "JSON-schema constrained", "tab:blue")]


def main(source: Path, target: Path) -> None:
    report = json.loads(source.read_text())
    batches = sorted(report["batches"], key=int)
    sizes = [int(batch) for batch in batches]
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    for side, label, color in SIDES:
        rows = [report["batches"][batch] for batch in batches]
        throughput.plot(sizes, [row[f"{side}_tokens_per_s"] for row in rows], "-o", label=label, color=color)
        latency.plot(sizes, [row[f"{side}_tbt_ms"]["p50"] for row in rows], "-o", label=f"{label}, p50", color=color)
        latency.plot(sizes, [row[f"{side}_tbt_ms"]["p99"] for row in rows], ":", label=f"{label}, p99", color=color)
    throughput.set(xscale="log", xlabel="concurrent requests", ylabel="output tokens / s", title="Throughput")
    latency.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="ms", title="Time between tokens")
    for axis in (throughput, latency):
        axis.set_xticks(sizes, [str(size) for size in sizes])
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"torch engine, {report['model']}, on {report['device']}")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
