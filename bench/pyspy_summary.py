"""Where a serving run's processes spend their CPU, from a py-spy profile of the whole run.

py-spy samples threads that are running (not those waiting for a lock, the GIL or I/O), so a
function's share here is CPU time, not wall time. Record with ``--subprocesses --threads --format
raw`` and read the file with this:

    py-spy record --subprocesses --threads --nonblocking --rate 50 --format raw -o profile.txt -- \
        python -m bench.layers ...
    python -m bench.pyspy_summary profile.txt --under Scheduler._step _Outgoing._run

For each process (named by its command line) it prints the samples per thread, then, for each
function named with ``--under``, what it called, by samples, as one frame and as a path of three.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("bench.pyspy_summary")
ROLES = ("triton_python_backend_stub", "spawn_main", "aiperf", "uvicorn", "tritonserver", "bench.layers")


@dataclass(frozen=True)
class Sample:
    process: str  # "<role> <pid>"
    thread: str
    frames: tuple[str, ...]  # outermost first, each a function's name without its file and line
    count: int


def samples(path: Path) -> Iterator[Sample]:
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        parts = stack.split(";")
        processes = [part for part in parts if part.startswith("process ")]
        rest = [part for part in parts if not part.startswith("process ")]
        thread = rest[0] if rest and rest[0].startswith("thread ") else ""
        frames = tuple(part.split(" (")[0] for part in rest[1 if thread else 0 :])
        yield Sample(_process_name(processes[-1]) if processes else "", thread, frames, int(count))


def _process_name(part: str) -> str:
    head, _, command = part.partition(":")
    pid = head.removeprefix("process ")
    role = next((name for name in ROLES if name in command), command.strip('"')[:40] or "(no command line)")
    return f"{role} {pid}"


def callees(profile: Sequence[Sample], process: str, function: str, depth: int) -> Counter[str]:
    """What ``function`` called in ``process``, by samples: paths of ``depth`` frames below it."""
    called: Counter[str] = Counter()
    for sample in profile:
        if sample.process == process and function in sample.frames:
            below = sample.frames[sample.frames.index(function) + 1 :]
            called[" > ".join(below[:depth]) or "(itself)"] += sample.count
    return called


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="py-spy's raw output")
    parser.add_argument("--processes", type=int, default=6, help="how many of the busiest processes to show")
    parser.add_argument("--under", nargs="*", default=[], help="functions whose callees to show")
    parser.add_argument("--top", type=int, default=8, help="lines per list")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    profile = list(samples(arguments.profile))
    per_process: Counter[str] = Counter()
    for sample in profile:
        per_process[sample.process] += sample.count
    for process, total in per_process.most_common(arguments.processes):
        logger.info("%s: %d samples", process, total)
        threads: Counter[str] = Counter()
        for sample in profile:
            if sample.process == process:
                threads[f"{sample.thread} {' > '.join(sample.frames[3:5])}"] += sample.count
        for thread, count in threads.most_common(arguments.top):
            logger.info("  %6d  %s", count, thread)
        for function in arguments.under:
            for depth in (1, 3):
                called = callees(profile, process, function, depth)
                if called:
                    logger.info("  under %s (%d frame%s):", function, depth, "s" if depth > 1 else "")
                    for path, count in called.most_common(arguments.top):
                        logger.info("    %6d  %s", count, path)


if __name__ == "__main__":
    main()
