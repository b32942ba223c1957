"""Two real tritonservers (``llgtriton triton``) behind one proxy (``llgtriton proxy``).

The replicas run the synthetic engine: what is under test is the routing between two real
servers (gRPC streams, readiness, a replica dying), not the model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from launcher.triton_server import live_children
from tests.support.harness import free_port, start_process, stop_process, triton_ports_argv

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Replica:
    process: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int

    def successes(self) -> float:
        """Requests this Triton served, from its own metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_request_success{") and 'model="llm"' in line
        )

    def settled_successes(self) -> float:
        """``successes`` once it stops moving: Triton counts a request only after the client has its
        final response, and the proxy's readiness probe sends each replica a health check."""
        last = self.successes()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = self.successes()
            if now == last:
                return now
            last = now
        return last


@dataclass(frozen=True)
class Cluster:
    replicas: tuple[Replica, Replica]
    proxy: subprocess.Popen[bytes]
    proxy_port: int

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{self.proxy_port}/v1", api_key="x", max_retries=0)


def start_replica(log: Path) -> Replica:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        "triton",
        *triton_ports_argv(http_port, grpc_port, metrics_port),
        "--engine-engine=synthetic",
        "--triton-max-restarts=0",  # a killed replica stays down: the proxy must route around it
    ]
    process = start_process(log, argv, f"http://127.0.0.1:{http_port}/v2/models/llm/ready")
    return Replica(process, grpc_port, metrics_port)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("replicas")
    replicas = (start_replica(logs / "triton-a.log"), start_replica(logs / "triton-b.log"))
    proxy_port = free_port()
    urls = ",".join(f"127.0.0.1:{replica.grpc_port}" for replica in replicas)
    argv = ["proxy", f"--proxy-port={proxy_port}", f"--proxy-triton-url={urls}", "--proxy-served-model-name=synthetic"]
    try:
        proxy = start_process(logs / "proxy.log", argv, f"http://127.0.0.1:{proxy_port}/ready")
    except BaseException:
        for replica in replicas:
            stop_process(replica.process)
        raise
    yield Cluster(replicas, proxy, proxy_port)
    for process in (proxy, *(replica.process for replica in replicas)):
        stop_process(process)


async def complete(sdk: openai.AsyncOpenAI, index: int) -> str:
    completion = await sdk.completions.create(model="synthetic", prompt=f"request {index}", max_tokens=4)
    return completion.choices[0].text


async def test_requests_are_spread_over_both_replicas(cluster: Cluster) -> None:
    before = [replica.settled_successes() for replica in cluster.replicas]
    async with cluster.sdk() as sdk:
        texts = await asyncio.gather(*(complete(sdk, index) for index in range(12)))
    assert texts == [" token" * 4] * 12
    served = [replica.settled_successes() - start for replica, start in zip(cluster.replicas, before, strict=True)]
    assert sum(served) == 12
    assert min(served) >= 3, f"one replica took almost everything: {served}"


async def test_a_dead_replica_is_routed_around_without_failed_requests(cluster: Cluster) -> None:
    survivor = cluster.replicas[1]
    victim = cluster.replicas[0].process
    (tritonserver,) = live_children(victim.pid, "tritonserver")
    os.killpg(tritonserver, signal.SIGKILL)  # the server and its stub; with no restarts left, the launcher exits
    assert victim.wait(30) == 1
    before = survivor.settled_successes()
    async with cluster.sdk() as sdk:
        texts = await asyncio.gather(*(complete(sdk, index) for index in range(10)))
        assert texts == [" token" * 4] * 10
        assert survivor.settled_successes() - before == 10
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.proxy_port}/ready", timeout=5) as response:
            assert response.status == 200  # one replica is enough to be ready
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.proxy_port}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert f'llgtriton_proxy_replica_retries_total{{replica="127.0.0.1:{cluster.replicas[0].grpc_port}"}}' in (
            metrics
        )
