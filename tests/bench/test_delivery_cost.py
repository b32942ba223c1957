"""bench.delivery_cost times both decoders over the same streams, and they stream the same text."""

from __future__ import annotations

from typing import Any

from bench.delivery_cost import measure


def test_each_cell_times_both_decoders_per_row(tokenizer: Any) -> None:
    (cell,) = measure(tokenizer, rows=[3], tokens=12, rounds=2)
    assert cell["rows"] == 3
    assert len(cell["transformers_ms_per_step"]) == len(cell["rust_ms_per_step"]) == 2
    assert cell["transformers_us_per_row"] > 0 and cell["rust_us_per_row"] > 0
    assert cell["rust_over_transformers"] > 0
