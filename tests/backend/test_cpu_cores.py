"""The cores a CPU engine sizes torch's threads by: the affinity, capped by a cgroup CPU quota
(docker --cpus, a Kubernetes CPU limit), read from a /proc/self and cgroup tree laid out as Linux
lays them out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.cpu_cores import cgroup_cpu_limit, usable_cores

AFFINITY = len(os.sched_getaffinity(0))


def fake_proc(tmp_path: Path, *, mounts: list[tuple[str, str, str, str]], cgroup: list[str]) -> Path:
    """A /proc/self with ``mounts`` (hierarchy root, mount point under tmp_path, fs type, super options)
    and the ``cgroup`` lines; returns its path."""
    proc = tmp_path / "proc"
    proc.mkdir()
    lines = ["22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw"]
    lines += [
        f"{30 + i} 22 0:{40 + i} {root} {tmp_path / point} rw,relatime shared:{9 + i} - {kind} {kind} {options}"
        for i, (root, point, kind, options) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text("\n".join(lines) + "\n")
    (proc / "cgroup").write_text("\n".join(cgroup) + "\n")
    return proc


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_a_cgroup_v2_container_with_docker_cpus_1_5_gets_two_cores(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, mounts=[("/", "cgroup", "cgroup2", "rw,nsdelegate")], cgroup=["0::/"])
    write(tmp_path / "cgroup" / "cpu.max", "150000 100000")
    assert cgroup_cpu_limit(proc) == 1.5
    assert usable_cores(proc) == min(AFFINITY, 2)


def test_an_ancestors_quota_applies_when_the_cgroups_own_is_max(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, mounts=[("/", "cgroup", "cgroup2", "rw")], cgroup=["0::/kubepods/pod1/ctr"])
    write(tmp_path / "cgroup" / "kubepods" / "pod1" / "cpu.max", "100000 100000")
    write(tmp_path / "cgroup" / "kubepods" / "pod1" / "ctr" / "cpu.max", "max 100000")
    write(tmp_path / "cgroup" / "kubepods" / "cpu.max", "400000 100000")
    assert cgroup_cpu_limit(proc) == 1.0
    assert usable_cores(proc) == 1


def test_a_cgroup_v1_cpu_hierarchy_mounted_at_the_containers_own_cgroup(tmp_path: Path) -> None:
    # Docker without a cgroup namespace: the mount's root is the container's cgroup.
    proc = fake_proc(
        tmp_path,
        mounts=[
            ("/docker/abc", "fs/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
            ("/docker/abc", "fs/memory", "cgroup", "rw,memory"),
        ],
        cgroup=["5:memory:/docker/abc", "4:cpu,cpuacct:/docker/abc", "0::/"],
    )
    write(tmp_path / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "300000")
    write(tmp_path / "fs" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000")
    write(tmp_path / "fs" / "memory" / "cpu.cfs_quota_us", "100000")  # (not the cpu controller's)
    assert cgroup_cpu_limit(proc) == 3.0


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    # A hybrid host like the development machine: v1 cpu with quota -1, a v2 mount without cpu.max.
    proc = fake_proc(
        tmp_path,
        mounts=[("/", "fs/cpu", "cgroup", "rw,cpu"), ("/", "fs/unified", "cgroup2", "rw")],
        cgroup=["1:cpu:/", "0::/"],
    )
    write(tmp_path / "fs" / "cpu" / "cpu.cfs_quota_us", "-1")
    write(tmp_path / "fs" / "cpu" / "cpu.cfs_period_us", "100000")
    assert cgroup_cpu_limit(proc) is None
    assert usable_cores(proc) == AFFINITY


@pytest.mark.parametrize(
    "files",
    [
        {},  # no /proc at all (not Linux)
        {"mountinfo": "garbage\n", "cgroup": "garbage\n"},
    ],
)
def test_what_cannot_be_read_is_no_quota(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        write(tmp_path / name, text)
    assert cgroup_cpu_limit(tmp_path) is None
    assert usable_cores(tmp_path) == AFFINITY


def test_a_quota_below_one_cpu_still_leaves_one_core(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, mounts=[("/", "cgroup", "cgroup2", "rw")], cgroup=["0::/"])
    write(tmp_path / "cgroup" / "cpu.max", "20000 100000")
    assert usable_cores(proc) == 1
