"""A CPU engine under a cgroup CPU quota (``docker run --cpus N``, a Kubernetes CPU limit): torch's
threads sized by the quota (the default) against sized by the affinity alone (one per core but one,
the default before the quota was read), side by side in one run.

Makes a cgroup with a quota of ``--cpus`` CPUs (root and a writable cgroup file system, v2 or v1),
and runs each measurement in a process of its own inside it: the engine in that process (no Triton,
no proxy), ``--concurrency`` clients in a closed loop of greedy chat requests, unconstrained and
JSON-schema constrained. The two thread counts alternate, ABBA, over ``--rounds`` rounds.

    sudo .venv/bin/python -m bench.cpu_quota --cpus 2 --rounds 2
    # on the GPU machine's 16 cores (random SmolLM2-135M weights; its model does not travel):
    python -m bench.cpu_quota --random-model device_carry/model --cpus 2 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from backend.assembly import start_torch_service
from backend.cpu_cores import CgroupMount, cgroup_cpu_limit, cpu_mounts, usable_cores
from backend.model_loader import torch_threads
from bench.layers import closed_loop, engine_settings, layer_requests, quiet_logging, served_model, via_engine
from bench.reports import write_report

logger = logging.getLogger("bench.cpu_quota")
PERIOD_US = 100_000


@contextlib.contextmanager
def quota_cgroup(cpus: float) -> Iterator[Path]:
    """A new cgroup, beside the cgroup file system's root, whose processes get ``cpus`` CPUs' worth of time."""
    mount = _writable_mount()
    group = mount.point / f"llgtriton-bench-{os.getpid()}"
    quota = int(cpus * PERIOD_US)
    if mount.version == 2:
        controllers = mount.point / "cgroup.subtree_control"
        if "cpu" not in controllers.read_text().split():
            controllers.write_text("+cpu")
        group.mkdir()
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    try:
        yield group
    finally:
        group.rmdir()  # (its processes have exited)


def _writable_mount() -> CgroupMount:
    mounts = cpu_mounts(Path("/proc/self/mountinfo").read_text())
    for mount in sorted(mounts, key=lambda m: -m.version):  # v2 first
        if mount.version == 1 or "cpu" in (mount.point / "cgroup.controllers").read_text().split():
            return mount
    raise SystemExit("no cgroup file system with the cpu controller")


def measure_in(group: Path, threads: int | None, arguments: argparse.Namespace, model: str) -> dict[str, Any]:
    """One measurement in a process of its own, moved into ``group`` before it starts."""
    command = [sys.executable, "-m", "bench.cpu_quota", "--child", str(threads or 0), "--model", model]
    command += ["--concurrency", str(arguments.concurrency), "--requests", str(arguments.requests)]
    command += ["--max-tokens", str(arguments.max_tokens)]

    def join_group() -> None:
        (group / "cgroup.procs").write_text("0")  # (0: the writing process)

    started = time.perf_counter()
    done = subprocess.run(
        command, check=False, preexec_fn=join_group, capture_output=True, text=True, timeout=arguments.timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"measurement failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    result["process_s"] = time.perf_counter() - started
    return result


def child(arguments: argparse.Namespace) -> None:
    """Serve with ``--child`` threads (0: the default) and print the figures as one JSON line."""
    threads = arguments.child or None
    settings = engine_settings(arguments.model, "cpu", max_batch_size=max(8, arguments.concurrency))
    settings = settings.model_copy(update={"num_threads": threads, "coalesce_responses": False})
    service = start_torch_service(settings)
    try:
        figures: dict[str, Any] = {
            "cgroup_cpu_limit": cgroup_cpu_limit(),
            "usable_cores": usable_cores(),
            "torch_threads": torch.get_num_threads(),
        }
        for constrained in (False, True):
            requests = layer_requests(arguments.requests, arguments.max_tokens, constrained)
            send = lambda request, index: via_engine(service, request, index)  # noqa: E731
            asyncio.run(closed_loop(send, requests[: arguments.concurrency], arguments.concurrency))  # untimed
            kind = "constrained" if constrained else "free"
            figures[kind] = asyncio.run(closed_loop(send, requests, arguments.concurrency))
    finally:
        service.shutdown()
    sys.stdout.write(json.dumps(figures) + "\n")


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median tokens/s with threads sized by the quota over that with threads sized by the affinity."""
    ratios = {}
    for kind in ("free", "constrained"):
        by = {
            label: [r[kind]["tokens_per_s"] for r in runs if r["sized_by"] == label] for label in ("quota", "affinity")
        }
        ratios[kind] = statistics.median(by["quota"]) / statistics.median(by["affinity"])
    return ratios


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", type=float, default=2.0, help="the cgroup's CPU quota, in CPUs")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds (AB, BA, AB, ...)",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8, help="requests per kind (free, constrained)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--random-model", type=Path, help="config + tokenizer folder: serve random weights")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--timeout-s", type=float, default=600, help="per measurement")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llgtriton-cpu-quota"), help="random checkpoint")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="cpu_quota")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    quiet_logging()
    if arguments.child is not None:
        child(arguments)
        return
    model = served_model(arguments.model, arguments.random_model, None, arguments.work)
    affinity = len(os.sched_getaffinity(0))
    before = max(1, affinity - 1)  # what the default was before it read the quota
    now = torch_threads(engine_settings(model, "cpu", 8), environ={})  # (outside the cgroup: the affinity's)
    logger.info("%d cores; quota %.2f CPUs; threads by affinity %d", affinity, arguments.cpus, before)
    runs: list[dict[str, Any]] = []
    with quota_cgroup(arguments.cpus) as group:
        for round_ in range(arguments.rounds):
            order = [("quota", None), ("affinity", before)]
            for label, threads in order if round_ % 2 == 0 else order[::-1]:
                result = measure_in(group, threads, arguments, model)
                result["sized_by"] = label
                runs.append(result)
                logger.info("%s: %s", label, json.dumps(result))
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "affinity_cores": affinity,
        "cpus": arguments.cpus,
        "threads_by_affinity": before,
        "threads_outside_the_cgroup": now,
        "concurrency": arguments.concurrency,
        "requests": arguments.requests,
        "max_tokens": arguments.max_tokens,
        "model": "random weights" if arguments.random_model else model,
        "runs": runs,
        "tokens_per_s_quota_over_affinity": summary(runs),
    }
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
