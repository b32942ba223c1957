"""The cores this process may use: its CPU affinity, and its cgroup's CPU quota.

A container started with ``docker run --cpus 2`` (or under a Kubernetes CPU limit) sees every
core of its host in its affinity, but the kernel throttles it to two CPUs' worth of time per
period. Threads sized to the affinity then wait out the throttling at every operator's barrier.
The quota is in the cgroup file system: ``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` and
``cpu.cfs_period_us`` (v1), in the process's cgroup or any of its ancestors, found through
``/proc/self/cgroup`` and ``/proc/self/mountinfo``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

logger = logging.getLogger(__name__)

PROC_SELF = Path("/proc/self")


@dataclass(frozen=True)
class CgroupMount:
    """A mounted cgroup hierarchy that controls CPU time."""

    version: int  # 1 or 2
    root: PurePosixPath  # the hierarchy's directory mounted here
    point: Path  # where it is mounted


def usable_cores(proc: Path = PROC_SELF) -> int:
    """The cores this process may run on (its affinity, as OpenMP counts them), at most its cgroup's
    CPU quota rounded up."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    limit = cgroup_cpu_limit(proc)
    return cores if limit is None else max(1, min(cores, math.ceil(limit)))


def cgroup_cpu_limit(proc: Path = PROC_SELF) -> float | None:
    """CPUs' worth of time the process's cgroups allow (the least quota over them and their
    ancestors), or None: no quota, or no cgroup file system to read one from."""
    try:
        mounts = cpu_mounts((proc / "mountinfo").read_text())
        memberships = cpu_cgroups((proc / "cgroup").read_text())
    except (OSError, ValueError):  # (not Linux, /proc not mounted, or a format this does not know)
        return None
    limits = [
        limit
        for version, path in memberships
        for mount in mounts
        if mount.version == version and path.is_relative_to(mount.root)
        for limit in _quotas(mount, mount.point / path.relative_to(mount.root))
    ]
    return min(limits, default=None)


def cpu_mounts(mountinfo: str) -> list[CgroupMount]:
    """The cgroup v2 mounts, and the v1 mounts of the ``cpu`` controller, in ``/proc/self/mountinfo``."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()  # (the optional fields end at "-": fs type, source, super options follow)
        tail = fields[fields.index("-", 6) + 1 :] if "-" in fields[6:] else []
        if len(tail) < 3:
            continue
        kind, options = tail[0], tail[2].split(",")
        if kind == "cgroup2" or (kind == "cgroup" and "cpu" in options):
            version = 2 if kind == "cgroup2" else 1
            mounts.append(CgroupMount(version, PurePosixPath(fields[3]), Path(fields[4])))
    return mounts


def cpu_cgroups(cgroup: str) -> list[tuple[int, PurePosixPath]]:
    """``(version, path)`` of the process's v2 cgroup and its v1 ``cpu`` cgroup, from ``/proc/self/cgroup``."""
    memberships = []
    for line in cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            memberships.append((2, PurePosixPath(path)))
        elif "cpu" in controllers.split(","):
            memberships.append((1, PurePosixPath(path)))
    return memberships


def _quotas(mount: CgroupMount, directory: Path) -> Iterator[float]:
    """The quotas set in ``directory`` and its ancestors up to the mount point, in CPUs."""
    for place in (directory, *directory.parents):
        limit = _quota(mount.version, place)
        if limit is not None:
            yield limit
        if place == mount.point:
            return


def _quota(version: int, directory: Path) -> float | None:
    try:
        if version == 2:
            quota, period = (directory / "cpu.max").read_text().split()
        else:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
    except OSError:  # (no such file: no cpu controller there)
        return None
    if quota in ("max", "-1"):
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        logger.warning("cannot read the CPU quota in %s: %r / %r", directory, quota, period)
        return None
