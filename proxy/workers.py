"""The OpenAI proxy as uvicorn servers: one in this process, or several processes on one port.

One proxy process forwards 8,000 to 10,000 streamed chunks a second, on one core
(docs/benchmarks.md, issue 8). With ``--proxy-workers N``, this process binds the port, and N
spawned workers accept on that one socket, each with its own event loop and its own gRPC channel
to Triton. The supervisor here starts a new worker when one dies, and on shutdown lets them drain.

What the workers share:
- the concurrency limit, through one in-flight slot per worker in shared memory
  (:class:`proxy.guards.SharedInFlight`);
- the metrics, through prometheus_client's multiprocess files in a directory this process owns.
  ``/metrics`` sums them, whichever worker answers it.

Workers are spawned, not forked: the supervisor has an event loop, threads and tritonserver's
pipes, none of which a fork would carry safely.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

from llgtriton.logs import configure_logging
from llgtriton.settings import Settings

if TYPE_CHECKING:
    import uvicorn

    from proxy.app import SharedState

logger = logging.getLogger(__name__)

METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_BACKLOG = 2048  # uvicorn's default
_EARLY_EXIT_S = 10.0  # a worker that exits sooner than this after starting likely cannot start at all
_MAX_EARLY_EXITS = 3


def triton_key(settings: Settings) -> str | None:
    key = settings.triton.inference_key
    return None if key is None else key.get_secret_value()


def uvicorn_server(settings: Settings, shared: SharedState | None = None) -> uvicorn.Server:
    """The proxy app in a uvicorn server configured from ``settings``, not yet started."""
    # Imported late: `--help` and `--print-config` stay fast and need no proxy dependencies.
    import uvicorn

    from proxy.app import create_app
    from proxy.http_protocol import guarded_protocol

    config = uvicorn.Config(
        create_app(settings.proxy, shared=shared, triton_key=triton_key(settings)),
        host=settings.proxy.host,
        port=settings.proxy.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=settings.proxy.drain_timeout_s,
        backlog=_BACKLOG,
        # httptools parses and frames HTTP in C, with our limits on slow and oversized clients. The
        # loop is asyncio's own (asyncio.run), not uvloop, which made the gRPC aio client's calls
        # slower (docs/benchmarks.md, issue 8).
        http=guarded_protocol(settings.proxy),
        loop="asyncio",
    )
    return uvicorn.Server(config)


@dataclass(frozen=True)
class WorkerShares:
    """What the supervisor shares with its workers, each of which writes only its own index."""

    slots: ctypes.Array[ctypes.c_long]  # requests in flight
    ready: ctypes.Array[ctypes.c_byte]  # 1 once serving: tells a worker that died serving from one that cannot start
    metrics_dir: Path


def _serve_worker(settings: Settings, listener: socket.socket, index: int, shares: WorkerShares) -> None:
    """A worker process: serve the API on the supervisor's socket until SIGINT/SIGTERM."""
    # prometheus_client picks where values live when it is first imported: set the directory first.
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before its multiprocess directory was set")
    os.environ[METRICS_DIR_VARIABLE] = str(shares.metrics_dir)
    configure_logging(settings.log_level)

    from proxy.app import SharedState
    from proxy.guards import SharedInFlight

    supervisor = os.getppid()

    async def serve() -> None:  # the app, and its gRPC channel, are made on the loop that serves them
        shared = SharedState(in_flight=SharedInFlight(shares.slots, index), metrics_dir=shares.metrics_dir)
        server = uvicorn_server(settings, shared)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        shares.ready[index] = 1
        while not serving.done():  # a supervisor killed outright leaves no one to stop this worker
            await asyncio.wait([serving], timeout=1.0)
            if os.getppid() != supervisor:
                logger.error("the supervisor (pid %d) is gone; stopping", supervisor)
                server.should_exit = True
        await serving

    asyncio.run(serve())


def listen(host: str, port: int) -> socket.socket:
    """The listening socket the workers share.

    Made with ``IPPROTO_TCP`` spelled out: asyncio sets TCP_NODELAY only on connections whose
    socket says so, and accepted sockets inherit the listener's. With protocol 0, Nagle's algorithm
    held each small SSE chunk back until the client's delayed ACK, about 40 ms.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(_BACKLOG)
    except OSError:
        listener.close()
        raise
    listener.set_inheritable(True)
    return listener


class ProxyWorkers:
    """``settings.proxy.workers`` proxy processes serving one listening socket."""

    def __init__(self, settings: Settings, target: Callable[..., None] | None = None) -> None:
        """``target``: what a worker runs, with ``_serve_worker``'s arguments (tests replace it)."""
        self._settings = settings
        self._target = _serve_worker if target is None else target
        self._count = settings.proxy.workers
        self._context = multiprocessing.get_context("spawn")
        self._shares = WorkerShares(
            slots=self._context.RawArray(ctypes.c_long, self._count),
            ready=self._context.RawArray(ctypes.c_byte, self._count),
            metrics_dir=Path(tempfile.mkdtemp(prefix="llgtriton-proxy-metrics-")),
        )
        self._listener: socket.socket | None = None
        self._processes: list[BaseProcess] = []
        self._started = [0.0] * self._count
        self._early_exits = 0

    def start(self) -> None:
        """Bind the port (OSError when it is taken) and start every worker."""
        self._listener = listen(self._settings.proxy.host, self._settings.proxy.port)
        self._processes = [self._spawn(index) for index in range(self._count)]
        logger.info("%d proxy workers: pids %s", self._count, ", ".join(str(p.pid) for p in self._processes))

    def _spawn(self, index: int) -> BaseProcess:
        self._started[index] = time.monotonic()
        self._shares.ready[index] = 0
        process = self._context.Process(
            target=self._target,
            args=(self._settings, self._listener, index, self._shares),
            name=f"llgtriton-proxy-{index}",
        )
        process.start()
        return process

    def replace_dead(self) -> bool:
        """Start a new worker in place of each one that exited; its in-flight requests are gone.

        False, starting none, when workers keep dying before they serve: a worker that cannot serve
        at all would otherwise be restarted twice a second for ever. A worker that died while serving
        (whatever killed it, a request included) is always replaced.
        """
        from prometheus_client.multiprocess import mark_process_dead

        for index, process in enumerate(self._processes):
            if process.is_alive():
                continue
            lived = time.monotonic() - self._started[index]
            early = lived < _EARLY_EXIT_S and not self._shares.ready[index]
            self._early_exits = self._early_exits + 1 if early else 0
            if self._early_exits >= _MAX_EARLY_EXITS:
                logger.error(
                    "proxy worker %d (pid %s) exited with %s, %d workers in a row within %.0f s of starting; giving up",
                    index,
                    process.pid,
                    process.exitcode,
                    self._early_exits,
                    _EARLY_EXIT_S,
                )
                return False
            logger.error(
                "proxy worker %d (pid %s) exited with %s; starting another", index, process.pid, process.exitcode
            )
            if process.pid is not None:
                # Its in-flight gauges leave the sums; its counters stay in them.
                mark_process_dead(process.pid, str(self._shares.metrics_dir))  # type: ignore[no-untyped-call]
            self._shares.slots[index] = 0
            self._processes[index] = self._spawn(index)
        return True

    def stop(self, timeout: float) -> None:
        """SIGTERM every worker, wait up to ``timeout`` seconds for them to drain, then kill what is left."""
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("proxy worker pid %s did not stop in %.0f s; killing it", process.pid, timeout)
                process.kill()
                process.join()
        if self._listener is not None:
            self._listener.close()
        shutil.rmtree(self._shares.metrics_dir, ignore_errors=True)
