"""``--proxy-workers 2``: two proxy processes on one port, with one limit and one set of metrics.

The server runs the synthetic engine, so these tests are about the proxy processes. Which worker
accepts a connection is the kernel's choice; the tests find out from ``/proc`` which worker holds
each connection they open, so what they assert across workers holds however the kernel chose.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.triton_server import live_children
from tests.support.harness import RunningServer, start_server, stop_process, stop_server

pytestmark = pytest.mark.e2e

MODEL = "synthetic"
LIMIT = 2
WORKER_MARK = "spawn_main"  # the command line of a process that multiprocessing spawned
BODY = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4}).encode()


def _start(log: Path) -> RunningServer:
    return start_server(
        log,
        "--engine-engine=synthetic",
        f"--proxy-served-model-name={MODEL}",
        "--proxy-workers=2",
        f"--proxy-max-concurrent-requests={LIMIT}",
    )


@pytest.fixture(scope="module")
def workers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = _start(tmp_path_factory.mktemp("workers") / "serve.log")
    yield running
    stop_server(running)


def _workers(server: RunningServer) -> list[int]:
    return sorted(live_children(server.process.pid, WORKER_MARK))


def _socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the server's end of a TCP connection (``/proc/net/tcp``)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
            return inode
    return None


def _holder(server: RunningServer, connection: http.client.HTTPConnection) -> int:
    """The pid of the worker that accepted ``connection``."""
    assert connection.sock is not None
    client_port = connection.sock.getsockname()[1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        inode = _socket_inode(server.proxy_port, client_port)
        for pid in _workers(server) if inode else []:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd) == f"socket:[{inode}]":
                        return pid
                except OSError:  # closed while we looked
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no worker holds the connection from port {client_port}")


def _connections_on_each_worker(server: RunningServer) -> dict[int, http.client.HTTPConnection]:
    """One open connection per worker: connect until every worker has accepted one."""
    held: dict[int, http.client.HTTPConnection] = {}
    for _ in range(200):
        connection = http.client.HTTPConnection("127.0.0.1", server.proxy_port, timeout=30)
        connection.connect()
        pid = _holder(server, connection)
        if pid in held:
            connection.close()
        else:
            held[pid] = connection
        if len(held) == len(_workers(server)):
            return held
        time.sleep(0.01)
    raise AssertionError(f"200 connections all went to workers {sorted(held)}")


def _start_request(connection: http.client.HTTPConnection) -> None:
    """Send the headers and half the body: the request is admitted and holds its slot."""
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(BODY)))
    connection.endheaders()
    connection.send(BODY[: len(BODY) // 2])


def _finish_request(connection: http.client.HTTPConnection) -> tuple[int, bytes]:
    connection.send(BODY[len(BODY) // 2 :])
    response = connection.getresponse()
    return response.status, response.read()


def _complete(server: RunningServer) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.proxy_port, timeout=30)
    try:
        connection.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _metric(server: RunningServer, pattern: str) -> float:
    """One sample of ``/metrics``, read on a new connection (so from whichever worker accepts it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.proxy_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{pattern} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _settled(server: RunningServer, pattern: str) -> float:
    """``/metrics``' value once it has stopped moving: a worker counts a request just after its
    response is sent, so a count read right after a response may not hold it yet."""
    value = _metric(server, pattern)
    while True:
        time.sleep(0.3)
        again = _metric(server, pattern)
        if again == value:
            return value
        value = again


def _reaches(server: RunningServer, pattern: str, expected: float) -> float:
    """``/metrics``' value once it reaches ``expected`` (within 10 s), then settled."""
    deadline = time.monotonic() + 10
    while _metric(server, pattern) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return _settled(server, pattern)


COMPLETED = re.escape('llgtriton_proxy_requests_total{route="/v1/completions",status="200"}')
IN_FLIGHT = "llgtriton_proxy_requests_in_flight"


def test_two_workers_serve_the_port_and_metrics_sum_over_both(workers_server: RunningServer) -> None:
    assert len(_workers(workers_server)) == 2
    before = _settled(workers_server, COMPLETED)
    held = _connections_on_each_worker(workers_server)
    for connection in held.values():  # one request through each worker
        connection.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["choices"][0]["text"] == " token" * 4
        connection.close()
    # Whichever worker answers the scrape, it counts the requests of both.
    assert _reaches(workers_server, COMPLETED, before + 2) == before + 2
    assert [_metric(workers_server, COMPLETED) for _ in range(6)] == [before + 2] * 6


def test_the_concurrency_limit_counts_requests_on_every_worker(workers_server: RunningServer) -> None:
    held = _connections_on_each_worker(workers_server)
    assert len(held) == LIMIT  # one slot taken on each worker: each worker alone is under the limit
    for connection in held.values():
        _start_request(connection)
    deadline = time.monotonic() + 10
    while _metric(workers_server, IN_FLIGHT) < LIMIT and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [_metric(workers_server, IN_FLIGHT) for _ in range(4)] == [LIMIT] * 4
    for _ in range(4):  # new connections, on either worker: both see the limit reached
        status, body = _complete(workers_server)
        assert status == 429, body
        assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
    for connection in held.values():
        status, body = _finish_request(connection)
        assert status == 200, body
        connection.close()
    assert _complete(workers_server)[0] == 200


def test_a_worker_that_dies_is_replaced_and_its_counts_stay(workers_server: RunningServer) -> None:
    assert _complete(workers_server)[0] == 200
    before = _settled(workers_server, COMPLETED)
    first, second = _workers(workers_server)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = _workers(workers_server)
        if len(workers) == 2 and first not in workers:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"no worker replaced pid {first}:\n{workers_server.log_tail()}")
    assert second in workers
    assert f"proxy worker 0 (pid {first}) exited with -9; starting another" in workers_server.log_tail(200)
    assert all(_complete(workers_server)[0] == 200 for _ in range(8))
    assert _reaches(workers_server, COMPLETED, before + 8) == before + 8  # the dead worker's requests still count
    assert _metric(workers_server, IN_FLIGHT) == 0


def test_sigterm_lets_a_request_in_flight_finish_then_stops_every_worker(tmp_path: Path) -> None:
    server = _start(tmp_path / "serve.log")
    try:
        workers = _workers(server)
        connection = http.client.HTTPConnection("127.0.0.1", server.proxy_port, timeout=30)
        connection.connect()
        _start_request(connection)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(1)  # the workers are draining: the request admitted before is still served
        status, body = _finish_request(connection)
        assert status == 200, body
        connection.close()
        assert server.process.wait(60) == 0
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    finally:
        stop_process(server.process)
