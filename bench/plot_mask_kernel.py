"""Plot ``mask_kernel.json`` (from ``bench/gpu_kernel.sh``): kernel time against batch size.

.venv/bin/python -m bench.plot_mask_kernel docs/results/mask_kernel.json docs/mask_kernel.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SERIES = [
    ("ours_us", "llgtriton (PyCUDA)", "tab:blue"),
    ("xgrammar_cuda_us", "xgrammar CUDA", "tab:orange"),
    ("xgrammar_triton_us", "xgrammar Triton", "tab:green"),
    ("plain_us", "one thread per logit", "tab:gray"),
    ("torch_us", "torch reference", "tab:red"),
    ("floor_us", "bandwidth floor", "black"),
]
KINDS = {"all": "all allowed", "half": "50% random", "one": "1 token allowed"}


def main(source: Path, target: Path, vocab: int = 128256) -> None:
    report = json.loads(source.read_text())
    rows = [r for r in report["results"] if r["vocab"] == vocab]
    dtypes = sorted({r["dtype"] for r in rows}, reverse=True)
    figure, axes = plt.subplots(len(dtypes), len(KINDS), figsize=(15, 4.5 * len(dtypes)), squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, (kind, title) in enumerate(KINDS.items()):
            axis = axes[i][j]
            cells = sorted((r for r in rows if r["dtype"] == dtype and r["kind"] == kind), key=lambda r: r["batch"])
            for key, label, color in SERIES:
                if all(key in r for r in cells):
                    style = "--" if key == "floor_us" else "-o"
                    axis.plot([r["batch"] for r in cells], [r[key] for r in cells], style, label=label, color=color)
            axis.set(xscale="log", yscale="log", xlabel="batch (rows)", ylabel="µs per call")
            axis.set_title(f"{dtype}, vocab {vocab}, {title}")
            axis.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle(f"Token-mask kernels on {report['device']} (kernel time from CUPTI)")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
