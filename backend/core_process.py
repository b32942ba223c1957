"""The engine in a process of its own: Triton's python stub only takes requests in and sends responses out.

In the stub, the step loop shares one GIL with the stub's own threads and with the thread that
sends responses (each send a round trip to the server); its steps ran slower there than in a
plain process (docs/benchmarks.md). Here the step loop runs in a child process, the *core*,
which has no other work; the stub keeps what needs Triton: the response senders, the response
pump and the cancellation checks.

Between them, one pipe of pickled messages. Requests go down one by one; the core's replies go up
in batches, one ``send`` per batch, so a step's outputs cost one message. A cancellation seen by the
stub goes down as a message; the core's sinks read a flag at the next step. The core reports its
load and step totals twice a second for the metrics.

When the core dies, or goes silent (stopped, wedged) for :data:`STUCK_AFTER_S`, every request in
flight ends with an error and a new core starts; meanwhile the health check says it is unavailable.
When the stub dies, the core sees its pipe close and exits.

Several model instances (stubs) of one Triton server share one core when given the same
:class:`CoreRendezvous`: a stub sends only so many responses a second, while the engine batches
best as one. The stub that takes the rendezvous's lock starts the core and *leads*; the others
join it over a Unix socket. A joined stub whose core goes away fails its requests and joins again, or
leads if the leader went too.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from backend.contract import ResponseSink
from backend.core_server import (
    STATUS_INTERVAL_S,
    STOP_TIMEOUT_S,
    Cancel,
    Failed,
    Ready,
    Reply,
    Status,
    Submit,
    reply_from_wire,
    run_core,
)
from backend.errors import Unavailable, error_of_kind
from backend.interpreter import this_python
from backend.response_pump import ResponsePump
from backend.telemetry import StepCounters, StepTotals
from llgtriton.settings import EngineSettings
from llgtriton.wire import GenerationRequest

logger = logging.getLogger(__name__)

# The core reports every STATUS_INTERVAL_S from a thread of its own; silent this long, it is stuck
# (stopped, or its threads wedged): its requests fail and it is replaced. Before then, a core
# silent for more than HEALTHY_SILENCE_S makes the health check (and the proxy's /ready) say no.
STUCK_AFTER_S = 10.0
HEALTHY_SILENCE_S = 2.0
CANCEL_POLL_S = 0.005  # how often the stub looks for cancelled requests to tell the core about
# Without the response pump each look is a round trip to Triton per request: look less often.
UNPUMPED_CANCEL_POLL_S = 0.02
START_TIMEOUT_S = 1800.0  # loading a model (and capturing its CUDA graphs) may take long
JOIN_RETRY_S = 0.2  # how often a stub looks for the core that another instance is starting

# The stub's side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CoreRendezvous:
    """Where the model instances of one Triton server find their shared core: a lock that the
    leading stub holds while it runs the core, and the Unix socket the core listens on."""

    socket: Path
    lock: Path

    @classmethod
    def named(cls, name: str) -> CoreRendezvous:
        """The rendezvous for ``name`` (a server and a model), in a folder only this user may enter."""
        folder = Path(tempfile.gettempdir()) / f"llgtriton-{os.getuid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
            raise RuntimeError(f"{folder} must belong to this user alone")
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return cls(folder / f"core-{digest}.sock", folder / f"core-{digest}.lock")

    def try_lead(self) -> int | None:
        """The lock's open descriptor when this stub now leads (held until closed), else None."""
        descriptor = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        return descriptor


class _JoinedCore:
    """The core another stub started, as far as this stub can act on it: by its pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode: int | None = None

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        """Its leader waits for it; this stub does not."""

    def is_alive(self) -> bool:
        return False  # not this stub's to stop


class CoreProcess:
    """A :class:`~backend.contract.Service` whose engine runs in a child process."""

    def __init__(
        self,
        settings: EngineSettings,
        pump: ResponsePump | None = None,
        *,
        python: str | None = None,
        target: Callable[[EngineSettings, Connection, str | None], None] = run_core,
        stuck_after_s: float = STUCK_AFTER_S,
        rendezvous: CoreRendezvous | None = None,
    ) -> None:
        self._settings = settings
        self._rendezvous = rendezvous
        self._lead: int | None = None  # the rendezvous lock's descriptor while this stub leads
        self._stuck_after_s = stuck_after_s
        self._pump = pump
        self._python = python or this_python()
        self._target = target
        self._keys = itertools.count(1)
        self._open: dict[int, ResponseSink] = {}
        self._told: set[int] = set()  # cancellations sent down
        self._lock = threading.Lock()  # the open requests, the pipe's sending end
        self._counters = StepCounters()
        self._earlier = StepTotals()  # of the cores before this one: the totals only ever grow
        self._load = (0, 0)
        self._stopping = threading.Event()
        self._restarting = False
        self._connection, self._process = self._start()
        self._heard = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="llgtriton-core-reader", daemon=True)
        self._reader.start()
        self._canceller = threading.Thread(target=self._cancel, name="llgtriton-core-cancel", daemon=True)
        self._canceller.start()
        # Apart from the reader, which a core stopped halfway through a message leaves blocked in recv().
        self._watchdog = threading.Thread(target=self._watch, name="llgtriton-core-watchdog", daemon=True)
        self._watchdog.start()

    @property
    def step_counters(self) -> StepCounters:
        return self._counters

    @property
    def pid(self) -> int | None:
        pid: int | None = self._process.pid
        return pid

    @property
    def reports_engine(self) -> bool:
        return self._rendezvous is None or self._lead is not None

    def load(self) -> tuple[int, int]:
        return self._load

    def _start(self) -> tuple[Connection, Any]:
        """A core to talk to: started here, or, with a rendezvous, the one another instance leads."""
        if self._rendezvous is None:
            return self._spawn(None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._lead is None:
                self._lead = self._rendezvous.try_lead()
            if self._lead is not None:
                return self._spawn(str(self._rendezvous.socket))
            joined = self._join(self._rendezvous)
            if joined is not None:
                return joined
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no engine process to join at {self._rendezvous.socket} within {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(JOIN_RETRY_S)

    @staticmethod
    def _join(rendezvous: CoreRendezvous) -> tuple[Connection, _JoinedCore] | None:
        try:
            connection = Client(str(rendezvous.socket), family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):  # its leader is still starting it
            return None
        try:
            ready = connection.recv() if connection.poll(STOP_TIMEOUT_S) else None
        except (EOFError, OSError):
            ready = None
        if not isinstance(ready, Ready):
            connection.close()
            return None
        logger.info("joined the engine process %d", ready.pid)
        return connection, _JoinedCore(ready.pid)

    def _spawn(self, listen_at: str | None) -> tuple[Connection, Any]:
        context = multiprocessing.get_context("spawn")
        context.set_executable(self._python)
        parent, child = context.Pipe()
        process = context.Process(
            target=self._target, args=(self._settings, child, listen_at), name="llgtriton-core", daemon=True
        )
        started = time.monotonic()
        process.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            process.kill()
            raise RuntimeError(f"the engine process did not start within {START_TIMEOUT_S:.0f} s")
        try:
            first = parent.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(f"the engine process exited while starting (exit code {process.exitcode})") from None
        if isinstance(first, Failed):
            process.join(STOP_TIMEOUT_S)
            raise RuntimeError(f"the engine could not start: {first.message}")
        logger.info("engine process %d ready in %.1f s", process.pid, time.monotonic() - started)
        return parent, process

    def submit(self, request: GenerationRequest, request_id: str, sink: ResponseSink) -> None:
        if self._stopping.is_set():
            raise Unavailable("the backend is shutting down")
        key = next(self._keys)
        pumped = self._pump.wrap(sink, request_id) if self._pump is not None else None
        with self._lock:
            self._open[key] = pumped or sink
            try:
                self._connection.send(Submit(key, request_id, request))
            except (OSError, ValueError):  # the core is down; the reader restarts it
                self._open.pop(key, None)
                if pumped is not None:  # refused: the caller fails the sink, and nothing may touch it after
                    pumped.discard()
                raise Unavailable("the engine is restarting; try again shortly") from None

    def health(self) -> None:
        if self._stopping.is_set():
            raise Unavailable("the backend is shutting down")
        if self._restarting:
            raise Unavailable("the engine process is restarting")
        silent = time.monotonic() - self._heard
        if silent > HEALTHY_SILENCE_S:
            raise Unavailable(f"the engine process has not reported for {silent:.1f} s")

    def _read(self) -> None:
        while not self._stopping.is_set():
            try:
                batch = self._connection.recv()
            except (EOFError, OSError):
                if self._stopping.is_set():
                    return
                self._restart()
                continue
            self._heard = time.monotonic()
            for item in batch:
                if isinstance(item, Status):
                    self._load = (item.running, item.waiting)
                    self._counters.set_totals(self._earlier + item.totals)
                else:
                    self._deliver(reply_from_wire(item))

    def _deliver(self, reply: Reply) -> None:
        with self._lock:
            sink = self._open.pop(reply.key, None) if reply.final else self._open.get(reply.key)
            if reply.final:
                self._told.discard(reply.key)
        if sink is None:
            return
        if reply.error is not None:
            sink.fail(error_of_kind(*reply.error))
        elif reply.output is not None:
            sink.send(reply.output, final=reply.final)

    def _watch(self) -> None:
        """Kill a core silent for :data:`STUCK_AFTER_S`: its end of the pipe closes, the reader's
        ``recv`` ends, and :meth:`_restart` follows as for a core that died."""
        while not self._stopping.wait(STATUS_INTERVAL_S):
            if self._restarting or time.monotonic() - self._heard <= self._stuck_after_s:
                continue
            logger.error("the engine process %s sent nothing for %.0f s; killing it", self.pid, self._stuck_after_s)
            self._restarting = True
            with contextlib.suppress(ProcessLookupError, OSError):
                self._process.kill()

    def _restart(self) -> None:
        """The core died: its requests end with an error, and a new core takes over."""
        self._restarting = True
        self._process.join(5)
        with self._lock:  # (not while a submit writes to it)
            self._connection.close()
        if isinstance(self._process, _JoinedCore):
            logger.error("the engine process %d went away; joining its successor", self._process.pid)
        else:
            logger.error("the engine process exited (code %s); restarting it", self._process.exitcode)
        self._earlier = self._counters.totals()
        with self._lock:
            lost, self._open, self._told = self._open, {}, set()
        for sink in lost.values():
            sink.fail(Unavailable("the engine process exited; the request was lost"))
        while not self._stopping.is_set():
            try:
                connection, process = self._start()
            except RuntimeError:
                logger.exception("the engine process could not be restarted; trying again")
                time.sleep(1.0)
                continue
            with self._lock:
                self._connection, self._process = connection, process
            self._heard, self._restarting = time.monotonic(), False
            return

    def _cancel(self) -> None:
        """Tells the core about requests whose clients went away (the pump or the sink knows)."""
        interval = CANCEL_POLL_S if self._pump is not None else UNPUMPED_CANCEL_POLL_S
        while not self._stopping.wait(interval):
            with self._lock:
                gone = [key for key, sink in self._open.items() if key not in self._told and _cancelled(sink)]
                for key in gone:
                    self._told.add(key)
                    try:
                        self._connection.send(Cancel(key))
                    except (OSError, ValueError):
                        break

    def shutdown(self) -> None:
        self._stopping.set()
        if self.reports_engine:  # this stub runs the core: it stops it
            with self._lock, contextlib.suppress(OSError, ValueError):
                self._connection.send(None)
        self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
        self._connection.close()
        if self._lead is not None:  # another instance may lead now
            os.close(self._lead)
            self._lead = None
        if self._pump is not None:
            self._pump.close()


def _cancelled(sink: ResponseSink) -> bool:
    try:
        return sink.is_cancelled()
    except Exception:
        return True
