"""The pieces several proxy processes share: the listening socket and the in-flight slots.

The processes themselves, started by ``llgtriton serve --proxy-workers 2``, are tested end to end
in ``tests/e2e/test_proxy_workers.py``.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import socket
import time

from llgtriton.settings import ProxySettings, Settings
from proxy.guards import SharedInFlight
from proxy.workers import ProxyWorkers, listen
from tests.support.harness import free_port


async def test_connections_accepted_on_the_shared_socket_send_small_writes_at_once() -> None:
    """TCP_NODELAY: a streamed chunk is not held back until the client acknowledges the last one."""
    listener = listen("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connection, sock=listener)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        assert await asyncio.wait_for(accepted, 5) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_every_process_sees_the_sum_of_the_slots() -> None:
    slots = multiprocessing.get_context("spawn").RawArray(ctypes.c_long, 3)
    first, second = SharedInFlight(slots, 0), SharedInFlight(slots, 2)
    first.add(1)
    second.add(1)
    second.add(1)
    assert first.total() == second.total() == 3
    second.add(-2)
    assert first.total() == 1
    assert list(slots) == [1, 0, 0]  # each wrote only its own slot


def exit_at_once(*arguments: object) -> None:
    """A worker that cannot serve: it returns (exit code 0) as soon as it starts."""


def test_workers_that_keep_dying_at_start_are_given_up_after_three() -> None:
    workers = ProxyWorkers(Settings(proxy=ProxySettings(port=free_port(), workers=2)), target=exit_at_once)
    workers.start()
    try:
        replaced: list[bool] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not replaced or replaced[-1]):
            time.sleep(0.2)
            replaced.append(workers.replace_dead())
        assert replaced[-1] is False  # it stopped replacing them, rather than spawning twice a second for ever
    finally:
        workers.stop(5)
