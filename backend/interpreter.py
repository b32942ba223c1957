"""The Python that runs the backend's child processes (the engine core, the mask process)."""

from __future__ import annotations

import sys
from pathlib import Path


def this_python() -> str:
    """This environment's interpreter: inside Triton's stub, ``sys.executable`` is the stub itself."""
    for candidate in (Path(sys.prefix) / "bin" / "python3", Path(sys.prefix) / "bin" / "python"):
        if candidate.exists():
            return str(candidate)
    return sys.executable
