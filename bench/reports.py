"""Where a benchmark's report goes, and what every report says about the machine it ran on."""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench.reports")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write a benchmark's report as JSON (its folder made if need be) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    logger.info("report: %s", path)


def host_cpu() -> str:
    """The host's CPU (host times follow it more than the GPU), as /proc/cpuinfo names it, with its
    family and model numbers, which a virtual machine's generic name ("Intel(R) Xeon(R) Processor")
    leaves out."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            break  # the first processor's fields are enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name
