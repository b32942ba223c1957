"""vLLM's cancellation scenario, repeated: how long a new request takes after 200 clients gave up.

Each round sends 200 chat requests (half of them streaming, 400 tokens each) whose clients give up
after 0.5 s, then one new request (5 tokens), and records how long that one took and the CPU
seconds the server's processes (proxy, tritonserver, the python stub) spent in the round. The
scenario is ``tests/e2e/test_reliability.py``'s (both call ``tests/support/abandon.py``), whose new request
must finish within 5 s; the test also forbids the end tokens, which this benchmark leaves allowed (no
story ends within 0.5 s: every round counts 200 abandoned).

``--busy N`` runs N processes that spin on the CPU meanwhile: other work on the machine, as on a
shared CI runner. ``--num-threads`` serves once per value with that ``--engine-num-threads``
(``default``: the server's own choice).

    .venv/bin/python -m bench.abandon --rounds 8 --busy 1 --num-threads default 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import openai

from bench.layers import quiet_logging, running_server
from bench.reports import write_report
from bench.soak import tree_proc_files
from tests.support.abandon import abandon_requests

logger = logging.getLogger("bench.abandon")


def _cpu_seconds(root: int) -> float:
    """User and system CPU seconds of ``root`` and its descendants so far, from /proc."""
    ticks = 0
    for stat in tree_proc_files(root, "stat"):
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])  # utime and stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes that spin on the CPU until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def rounds(proxy_port: int, server_pid: int, count: int) -> list[dict[str, float]]:
    base_url = f"http://127.0.0.1:{proxy_port}/v1"
    results = []
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
        model = client.models.list().data[0].id
        for _ in range(count):
            cpu_before = _cpu_seconds(server_pid)
            abandoned = asyncio.run(abandon_requests(base_url, model))
            started = time.perf_counter()
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=5, temperature=0
            )
            results.append(
                {
                    "abandoned": abandoned,
                    "new_request_s": round(time.perf_counter() - started, 3),
                    "server_cpu_s": round(_cpu_seconds(server_pid) - cpu_before, 2),
                }
            )
            logger.info("%s", results[-1])
            time.sleep(2)  # the abandoned requests' last responses drain
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU meanwhile")
    parser.add_argument("--num-threads", nargs="+", default=["default"], help="'default' or a thread count")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="abandon_cpu")
    arguments = parser.parse_args(argv)
    quiet_logging()
    arguments.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"date": date.today().isoformat(), "cores": os.cpu_count(), "busy": arguments.busy}
    for threads in arguments.num_threads:
        extra = [] if threads == "default" else [f"--engine-num-threads={int(threads)}"]
        with running_server(arguments.out, arguments.name, *extra) as server, busy_processes(arguments.busy):
            results = rounds(server.proxy_port, server.pid, arguments.rounds)
        seconds = [result["new_request_s"] for result in results]
        report[f"threads_{threads}"] = {
            "new_request_s_median": float(np.median(seconds)),
            "new_request_s_max": max(seconds),
            "server_cpu_s_median": float(np.median([result["server_cpu_s"] for result in results])),
            "rounds": results,
        }
        logger.info("threads %s: %s", threads, {k: v for k, v in report[f"threads_{threads}"].items() if k != "rounds"})
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
