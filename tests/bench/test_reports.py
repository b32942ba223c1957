"""Every benchmark writes its report through one function."""

from __future__ import annotations

import json
from pathlib import Path

from bench.reports import write_report


def test_a_report_lands_as_json_in_a_folder_made_for_it(tmp_path: Path) -> None:
    path = tmp_path / "results" / "nested" / "run.json"
    write_report(path, {"device": "cpu", "results": [{"us": 1.5}]})
    assert json.loads(path.read_text()) == {"device": "cpu", "results": [{"us": 1.5}]}
