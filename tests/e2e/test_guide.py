"""Every ``python`` block of docs/guide.md runs against a live server, in order, sharing one namespace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def test_the_guide_has_examples() -> None:
    assert len(BLOCKS) >= 7  # the extraction found them (a broken pattern would find none)


def test_every_example_in_the_guide_runs(server: RunningServer) -> None:
    namespace: dict[str, Any] = {"BASE_URL": server.openai_base_url}
    for index, block in enumerate(BLOCKS):
        try:
            exec(compile(block, f"{GUIDE.name} block {index + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/guide.md block {index + 1} failed:\n{block}") from exc
