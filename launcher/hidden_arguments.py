"""Keys that tritonserver takes only on its command line, kept out of the process list and the logs.

tritonserver reads its restricted-API keys from its arguments alone, and ``/proc/<pid>/cmdline`` is
readable by every local user. Once tritonserver has read its options (it has started its threads),
the launcher overwrites each key's characters in the child's argument memory through
``/proc/<pid>/mem``, which a parent may write (Linux lets a process trace its descendants); ``ps``
then shows asterisks. The logged command line never holds a key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

PARSED_TIMEOUT_S = 60.0  # until tritonserver starts its threads (after reading its options)


def redacted(argv: Sequence[str], secrets: Collection[str]) -> list[str]:
    """``argv`` with every secret replaced by asterisks, for the logs."""
    hidden = list(argv)
    for secret in filter(None, secrets):
        hidden = [argument.replace(secret, "*" * 8) for argument in hidden]
    return hidden


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def hide(pid: int, secrets: Collection[str], timeout_s: float = PARSED_TIMEOUT_S) -> bool:
    """Overwrite ``secrets`` in process ``pid``'s arguments once it has read them; False if that failed
    (the process exited, or this system does not let a parent write its child's memory)."""
    wanted = [secret.encode() for secret in secrets if secret]
    if not wanted:
        return True
    try:
        deadline = time.monotonic() + timeout_s
        while _threads(pid) < 2:  # still reading its options
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            arguments = memory.read(end - start)
            hidden = arguments
            for secret in wanted:
                hidden = hidden.replace(secret, b"*" * len(secret))
            memory.seek(start)
            memory.write(hidden)
    except (OSError, ValueError, IndexError) as exc:
        logger.debug("hiding the arguments of process %d failed: %s", pid, exc)
        return False
    return True
