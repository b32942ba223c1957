"""CPU use per process of a running server, over a measurement window, so the next bottleneck is named.

The server's process tree is read with psutil and each process named by its role: ``tritonserver``,
the python backend ``stub``, the engine ``core`` (the stub's child), ``proxy`` workers, ``launcher``
for ``llgtriton serve`` itself, and ``other`` (multiprocessing's resource tracker). A role's figure
is CPU seconds per wall second (1.0 is one core busy), summed over its processes. :class:`CpuRecorder`
samples the tree in a thread, so the figure can cover exactly a load generator's own measurement
window, not its start-up.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import psutil


def role(process: psutil.Process) -> str:
    name = process.name()
    if name.startswith("tritonserver"):
        return "tritonserver"
    if name.startswith("triton_python_b"):  # the stub's name, cut to 15 characters by the kernel
        return "stub"
    try:
        parent = process.parent()
    except psutil.Error:
        parent = None
    if parent is not None and parent.name().startswith("triton_python_b"):
        return "core"
    if any("spawn_main" in part for part in process.cmdline()):  # the launcher spawns the proxy's workers
        return "proxy"
    return "other"


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float  # time.time(), to line up with the timestamps load generators report
    seconds: dict[tuple[int, str], float]  # (pid, role) -> CPU seconds so far


def snapshot(root_pid: int) -> CpuSnapshot:
    """The CPU seconds of ``root_pid`` (the launcher) and every process under it, now."""
    seconds: dict[tuple[int, str], float] = {}
    root = psutil.Process(root_pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            key = (process.pid, "launcher" if process.pid == root_pid else role(process))
        except psutil.Error:  # gone between the listing and the reading
            continue
        seconds[key] = times.user + times.system
    return CpuSnapshot(time.time(), seconds)


def cores_by_role(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """Cores busy per role between two snapshots (processes that started in between count from zero)."""
    wall = after.wall - before.wall
    busy: dict[str, float] = defaultdict(float)
    for key, seconds in after.seconds.items():
        busy[key[1]] += (seconds - before.seconds.get(key, 0.0)) / wall
    return {name: round(value, 3) for name, value in sorted(busy.items())}


class CpuRecorder:
    """Snapshots of a process tree every ``period_s`` in a thread, from ``start()`` to ``stop()``."""

    def __init__(self, root_pid: int, period_s: float = 0.25) -> None:
        self._root_pid = root_pid
        self._period_s = period_s
        self._snapshots: list[CpuSnapshot] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="cpu-recorder", daemon=True)

    def start(self) -> None:
        self._snapshots.append(snapshot(self._root_pid))
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stopping.wait(self._period_s):
            taken = snapshot(self._root_pid)
            with self._lock:
                self._snapshots.append(taken)

    def cores_between(self, start: float, end: float) -> dict[str, float]:
        """Cores busy per role from the first snapshot at or after ``start`` to the last at or before ``end``."""
        taken = snapshot(self._root_pid)
        with self._lock:
            self._snapshots.append(taken)
            snapshots = list(self._snapshots)
        walls = [s.wall for s in snapshots]
        first = min(bisect.bisect_left(walls, start), len(snapshots) - 2)
        last = max(bisect.bisect_right(walls, end) - 1, first + 1)
        return cores_by_role(snapshots[first], snapshots[last])
