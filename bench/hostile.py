"""Hostile requests, as an attacker would send them: through the proxy and straight at Triton.

The cases are ``tests/support/attacks.py``'s, which ``tests/e2e/test_hostile.py`` asserts are
refused with a 400; this benchmark times each refusal and the normal request sent right after it.

    .venv/bin/python -m bench.hostile                          # one proxy process
    .venv/bin/python -m bench.hostile --proxy-workers 2 --name hostile_workers2
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from bench.layers import quiet_logging, running_server
from bench.reports import host_cpu, write_report
from tests.support.attacks import (
    PROXY_ATTACKS,
    TRITON_ATTACKS,
    ProxyAttack,
    TritonAttack,
    normal_request_seconds,
    proxy_attack,
    triton_attack,
)

logger = logging.getLogger("bench.hostile")


def _row(via: str, case: str, base_url: str, attack: Callable[[], tuple[str, str]]) -> dict[str, Any]:
    """Run ``attack`` (it returns the answer's status and message), then time a normal request."""
    started = time.perf_counter()
    status, message = attack()
    refused = time.perf_counter() - started
    logger.info("%-50s %s in %.3f s", case, status, refused)
    return {
        "via": via,
        "case": case,
        "status": status,
        "refusal_s": round(refused, 3),
        "message": message[:200],
        "next_request_s": round(normal_request_seconds(base_url), 3),
    }


def measure(base_url: str, grpc_url: str) -> list[dict[str, Any]]:
    def through_proxy(attack: ProxyAttack) -> tuple[str, str]:
        reply = proxy_attack(base_url, attack)
        return str(reply.status_code), str(reply.json().get("error", {}).get("message", ""))

    def at_triton(attack: TritonAttack) -> tuple[str, str]:
        error = triton_attack(grpc_url, attack)
        return (error or "answered").split(" ")[0], error or ""

    rows = [_row("proxy", a.name, base_url, functools.partial(through_proxy, a)) for a in PROXY_ATTACKS]
    return rows + [_row("triton", a.name, base_url, functools.partial(at_triton, a)) for a in TRITON_ATTACKS]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proxy-workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="hostile")
    arguments = parser.parse_args(argv)
    quiet_logging()
    arguments.out.mkdir(parents=True, exist_ok=True)
    with running_server(arguments.out, arguments.name, f"--proxy-workers={arguments.proxy_workers}") as server:
        base_url = f"http://127.0.0.1:{server.proxy_port}/v1"
        rows = measure(base_url, f"127.0.0.1:{server.grpc_port}")
    write_report(
        arguments.out / f"{arguments.name}.json",
        {
            "date": date.today().isoformat(),
            "host_cpu": host_cpu(),
            "proxy_workers": arguments.proxy_workers,
            "cases": rows,
        },
    )


if __name__ == "__main__":
    main()
