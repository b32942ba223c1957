"""Soak test: many concurrent clients, mixed requests, random cancellations, nothing lost.

Starts ``llgtriton serve`` on loopback (free ports) and runs ``--clients`` closed-loop clients for
``--seconds`` (and at most ``--max-requests`` requests). Each request is chosen at random:
streaming or not, constrained by a JSON schema or not, 4 to 48 tokens, and one in five is
abandoned by its client after 0.05 to 2 s. At the end it checks that the proxy has nothing in
flight and that a new request completes, and reports requests sent, completed, cancelled,
errored and lost (must be 0), constrained outputs that fail their schema (must be 0), latency
percentiles and the memory of the server's processes before and after.

``--hostile-share F`` sends, in place of a fraction F of the requests, one of ``bench.hostile``'s
attacks, which must each get a 400; the report then also says whether any of the server's
processes (tritonserver, the python stub, the proxy) had to be restarted.

    .venv/bin/python -m bench.soak --clients 64 --seconds 180
    .venv/bin/python -m bench.soak --clients 64 --seconds 360 --hostile-share 0.1 --name soak_hostile_cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai

from bench.jsonschemabench import SCHEMA
from bench.layers import quiet_logging, running_server
from bench.reports import write_report
from tests.support.attacks import PROXY_ATTACKS

logger = logging.getLogger("bench.soak")
HANG_TIMEOUT_S = 300.0  # a request still open after this long counts as hung (an error)


def process_tree(root: int) -> set[int]:
    """``root`` and all its descendants (tritonserver, the python stub), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])  # field 4: the parent
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def tree_proc_files(root: int, name: str) -> Iterator[str]:
    """``/proc/<pid>/<name>`` of ``root`` and of each descendant still running."""
    for pid in process_tree(root):
        try:
            yield Path(f"/proc/{pid}/{name}").read_text()
        except OSError:
            continue


def _rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, from /proc."""
    return sum(
        int(line.split()[1]) * 1024
        for status in tree_proc_files(root, "status")
        for line in status.splitlines()
        if line.startswith("VmRSS:")
    )


async def _in_flight(base: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{base}/metrics")).text
    for line in text.splitlines():
        if line.startswith("llgtriton_proxy_requests_in_flight "):
            return float(line.split()[1])
    raise RuntimeError("no in-flight gauge in /metrics")


class Soak:
    def __init__(self, client: openai.AsyncOpenAI, model: str, arguments: argparse.Namespace) -> None:
        self.client = client
        self.model = model
        self.arguments = arguments
        self.outcomes: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.first_tokens: list[float] = []
        self.errors: Counter[str] = Counter()
        self.sent = 0
        self.random = random.Random(arguments.seed)

    async def hostile(self, http: httpx.AsyncClient) -> None:
        attack = self.random.choice(PROXY_ATTACKS)
        self.sent += 1
        reply = await http.post(
            attack.path.lstrip("/"), content=attack.body, headers={"Content-Type": "application/json"}
        )
        self.outcomes["refused" if reply.status_code == 400 else "hostile_not_refused"] += 1
        if reply.status_code != 400:
            self.errors[f"{attack.name}: {reply.status_code}"] += 1

    async def one(self, index: int) -> None:
        stream = self.random.random() < 0.5
        constrained = self.random.random() < 0.5
        abandon_after = self.random.uniform(0.05, 2.0) if self.random.random() < 0.2 else None
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"Describe person {index} in a few words."}],
            "max_tokens": self.random.randint(4, 48),
            "temperature": self.random.choice([0.0, 0.7]),
            "stream": stream,
        }
        if constrained:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
            }
        self.sent += 1
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self._run(params, started, constrained), abandon_after or HANG_TIMEOUT_S)
        except TimeoutError:
            self.outcomes["cancelled" if abandon_after is not None else "hung"] += 1
        except openai.APIError as exc:
            self.outcomes["errored"] += 1
            self.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1

    async def _run(self, params: dict[str, Any], started: float, constrained: bool) -> None:
        if params["stream"]:
            text: list[str] = []
            finish: str | None = None
            chunks = await self.client.chat.completions.create(**params)
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    if not text:
                        self.first_tokens.append(time.perf_counter() - started)
                    text.append(chunk.choices[0].delta.content)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            content = "".join(text)
        else:
            response = await self.client.chat.completions.create(**params)
            content, finish = response.choices[0].message.content or "", response.choices[0].finish_reason
        self.latencies.append(time.perf_counter() - started)
        self.outcomes["completed"] += 1
        if constrained and finish == "stop":
            try:
                jsonschema.validate(json.loads(content), SCHEMA)
            except (ValueError, jsonschema.ValidationError):
                self.outcomes["invalid_constrained_output"] += 1

    async def client_loop(self, deadline: float, counter: list[int], http: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline and counter[0] < self.arguments.max_requests:
            counter[0] += 1
            if self.random.random() < self.arguments.hostile_share:
                await self.hostile(http)
            else:
                await self.one(counter[0])


def server_processes(root: int) -> frozenset[int]:
    """Pids of ``root``'s tritonserver, python stubs and proxy workers: one that changes was restarted."""
    names = (b"tritonserver", b"triton_python_backend_stub", b"spawn_main")
    found = set()
    for pid in process_tree(root) - {root}:
        try:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(name in command_line for name in names) and b"resource_tracker" not in command_line:
            found.add(pid)
    return frozenset(found)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values)
    return {"p50_s": float(np.percentile(array, 50)), "p99_s": float(np.percentile(array, 99)), "n": len(values)}


async def run(arguments: argparse.Namespace, proxy_port: int, group: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{proxy_port}"
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=None) as client:
        model = (await client.models.list()).data[0].id
        memory_before = _rss_bytes(group)
        soak = Soak(client, model, arguments)
        deadline, counter = time.monotonic() + arguments.seconds, [0]
        started = time.monotonic()
        memory_series: list[tuple[float, int]] = []

        async def sample_memory() -> None:  # a leak keeps climbing; warm-up growth levels off
            while True:
                memory_series.append((round(time.monotonic() - started), round(_rss_bytes(group) / 2**20)))
                await asyncio.sleep(arguments.seconds / 8)

        sampler = asyncio.create_task(sample_memory())
        processes_before = server_processes(group)
        async with httpx.AsyncClient(base_url=f"{base}/v1/", timeout=HANG_TIMEOUT_S) as http:
            await asyncio.gather(*(soak.client_loop(deadline, counter, http) for _ in range(arguments.clients)))
        sampler.cancel()
        elapsed = time.monotonic() - started
        settle = time.monotonic() + 30
        while await _in_flight(base) != 0 and time.monotonic() < settle:
            await asyncio.sleep(0.5)
        in_flight = await _in_flight(base)
        check_started = time.perf_counter()
        final = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=5, temperature=0
        )
        memory_after = _rss_bytes(group)
        processes_after = server_processes(group)
    accounted = sum(
        soak.outcomes[k] for k in ("completed", "cancelled", "errored", "hung", "refused", "hostile_not_refused")
    )
    return {
        "clients": arguments.clients,
        "seconds": round(elapsed, 1),
        "sent": soak.sent,
        "outcomes": dict(soak.outcomes),
        "lost": soak.sent - accounted,
        "errors": dict(soak.errors),
        "latency_completed": _percentiles(soak.latencies),
        "time_to_first_token_streamed": _percentiles(soak.first_tokens),
        "in_flight_after": in_flight,
        "new_request_after_s": round(time.perf_counter() - check_started, 2),
        "new_request_finish_reason": final.choices[0].finish_reason,
        "server_rss_mb_before": round(memory_before / 2**20),
        "server_rss_mb_after": round(memory_after / 2**20),
        "server_rss_mb_during": memory_series,
        "hostile_share": arguments.hostile_share,
        "server_processes_restarted": len(processes_before - processes_after),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--max-requests", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hostile-share", type=float, default=0.0, help="fraction of requests that are attacks")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="soak_cpu")
    arguments = parser.parse_args(argv)
    quiet_logging()
    arguments.out.mkdir(parents=True, exist_ok=True)
    with running_server(arguments.out, arguments.name) as server:
        report = asyncio.run(run(arguments, server.proxy_port, server.pid))
    write_report(arguments.out / f"{arguments.name}.json", report)
    logger.info("%s", json.dumps(report, indent=2))
    outcomes = report["outcomes"]
    if report["lost"] or any(outcomes.get(k) for k in ("hung", "invalid_constrained_output", "hostile_not_refused")):
        raise SystemExit("requests were lost, hung, broke their schema or were not refused")
    if report["server_processes_restarted"]:
        raise SystemExit("a server process was restarted during the soak")


if __name__ == "__main__":
    main()
