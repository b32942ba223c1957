"""Plot ``bench/gpu_serving.sh`` reports: output tokens/s and TTFT p50 against concurrency, for the engine
in process, Triton and the proxy (by whichever clients each report holds), one report per column.

python -m bench.plot_serving docs/serving_core.png docs/results/serving_core_off.json docs/results/serving_core_on.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LAYERS = [
    ("engine", "engine, in process", "tab:gray"),
    ("triton", "Triton (gRPC)", "tab:blue"),
    ("perf_analyzer", "Triton (perf_analyzer)", "tab:cyan"),
    ("proxy", "proxy (OpenAI SDK)", "tab:orange"),
    ("aiperf", "proxy (aiperf)", "tab:red"),
]
METRICS = [("tokens_per_s", "output tokens/s"), ("ttft_ms_p50", "TTFT p50 (ms)")]


def series(report: dict[str, Any], kind: str, layer: str, metric: str) -> tuple[list[int], list[float]]:
    cells = [
        (int(key.split("/")[0]), value[layer][metric])
        for key, value in report["results"].items()
        if key.endswith(kind) and metric in value.get(layer, {})  # a layer not run, or failed there
    ]
    cells.sort()
    return [c for c, _ in cells], [v for _, v in cells]


def main(target: Path, sources: list[Path]) -> None:
    reports = [json.loads(source.read_text()) for source in sources]
    figure, axes = plt.subplots(len(METRICS), len(reports), figsize=(5.5 * len(reports), 8), squeeze=False)
    for column, (source, report) in enumerate(zip(sources, reports, strict=True)):
        for row, (metric, label) in enumerate(METRICS):
            axis = axes[row][column]
            for layer, name, color in LAYERS:
                for kind, style in (("free", "-"), ("constrained", "--")):
                    x, y = series(report, kind, layer, metric)
                    if not x:
                        continue
                    axis.plot(x, y, style, marker="o", color=color, label=f"{name}, {kind}")
            axis.set_xscale("log", base=2)
            axis.set_xlabel("concurrent streaming clients")
            axis.set_ylabel(label)
            axis.set_title(f"{source.stem} (engine process: {report.get('core_process', '?')})", fontsize=9)
            axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
