"""The GIL-contention benchmark runs both ways and reports each call's time (the figures themselves come
from the GPU machine's CPU or this one, in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gil_contention import main
from bench.llama_model import tokenizer_folder


def test_it_reports_each_call_alone_and_beside_a_busy_thread(tmp_path: Path) -> None:
    main(["--tokenizer-dir", str(tokenizer_folder()), "--rows", "2", "--rounds", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gil_contention.json").read_text())
    assert set(report["cells"]) == {"alone", "beside a busy thread"}
    for cell in report["cells"].values():
        assert cell["consume_ms_median"] > 0 and cell["fill_ms_median"] > 0
