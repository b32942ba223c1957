"""The engine core's side: the messages between a stub and its core, and the core's main.

A core serves the stub that started it over a pipe and, when it is shared by several model
instances (``listen_at``), each further stub over a Unix socket of its own. Every stub's
connection has its own reply thread, request keys and cancellations; the engine and its step loop
are one. The core lives as long as the stub that started it: when that pipe closes, it stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import os
import queue
import signal
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from backend.contract import Service
from backend.errors import error_kind
from backend.telemetry import StepTotals
from llgtriton.settings import EngineSettings
from llgtriton.wire import ErrorKind, FinishReason, GenerationOutput, GenerationRequest

logger = logging.getLogger(__name__)

STATUS_INTERVAL_S = 0.5
STOP_TIMEOUT_S = 30.0

# Messages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    key: int
    request_id: str
    request: GenerationRequest


@dataclass(frozen=True)
class Cancel:
    key: int


@dataclass(frozen=True)
class Reply:
    """An output for request ``key`` (``final``: its last), or its failure as (kind, message)."""

    key: int
    output: GenerationOutput | None = None
    final: bool = False
    error: tuple[ErrorKind, str] | None = None


# Nearly every token's output is only text, a finish reason and counts. Such a reply crosses the pipe
# as a plain tuple: a dataclass pickles and unpickles about 25 times slower, under each side's GIL.
PlainReply = tuple[int, bool, str, str, int, int]  # key, final, text, finish reason ("": none), prompt, completion
_PLAIN_FIELDS = ("text", "finish_reason", "prompt_tokens", "completion_tokens")
_EXTRA_FIELDS = tuple(field for field in dataclasses.fields(GenerationOutput) if field.name not in _PLAIN_FIELDS)
_extras_of = operator.attrgetter(*(field.name for field in _EXTRA_FIELDS))
_NO_EXTRAS = tuple(field.default for field in _EXTRA_FIELDS)


def reply_to_wire(key: int, output: GenerationOutput, final: bool) -> PlainReply | Reply:
    """What the core sends for an output: a :data:`PlainReply` where the output has nothing else."""
    if _extras_of(output) != _NO_EXTRAS:
        return Reply(key, output, final)
    reason = output.finish_reason.value if output.finish_reason is not None else ""
    return (key, final, output.text, reason, output.prompt_tokens, output.completion_tokens)


def reply_from_wire(item: PlainReply | Reply) -> Reply:
    if isinstance(item, Reply):
        return item
    key, final, text, reason, prompt_tokens, completion_tokens = item
    finish = FinishReason(reason) if reason else None
    return Reply(key, GenerationOutput(text, finish, prompt_tokens, completion_tokens), final)


@dataclass(frozen=True)
class Status:
    running: int
    waiting: int
    totals: StepTotals


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class Failed:
    """The core could not start."""

    message: str


# The core (child process) -------------------------------------------------------------------


class _Outgoing:
    """Replies queued by the step loop's sinks, sent up in batches by a thread of their own.

    A ``SimpleQueue`` rather than a list under a ``Condition``: the step loop must never wait for the
    sending thread, and that thread, woken holding the condition's lock, first waits for the GIL."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._queue: queue.SimpleQueue[PlainReply | Reply | Status | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llgtriton-core-replies", daemon=True)
        self._thread.start()

    def put(self, item: PlainReply | Reply | Status) -> None:
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(STOP_TIMEOUT_S)

    def _run(self) -> None:
        closed = False
        while not closed:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._queue.get_nowait())
            closed = any(item is None for item in batch)  # close() was called: send the rest, then stop
            if closed:
                batch = [item for item in batch if item is not None]
            if batch:
                try:
                    self._connection.send(batch)
                except OSError:  # the stub is gone; its connection's reader sees it too
                    return


class _CoreSink:
    """A request's sink inside the core: its replies are queued for its stub; cancellation is a flag."""

    def __init__(self, key: int, stub: _StubConnection) -> None:
        self._key = key
        self._stub = stub

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        self._stub.outgoing.put(reply_to_wire(self._key, output, final))
        if final:
            self._stub.cancelled.discard(self._key)

    def fail(self, error: Exception) -> None:
        self._stub.outgoing.put(Reply(self._key, final=True, error=(error_kind(error), str(error))))
        self._stub.cancelled.discard(self._key)

    def is_cancelled(self) -> bool:
        return self._stub.gone or self._key in self._stub.cancelled


class _StubConnection:
    """One stub's connection to the core: its requests in, its replies out."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.outgoing = _Outgoing(connection)
        self.cancelled: set[int] = set()
        self.gone = False  # its requests still in the engine are cancelled

    def serve(self, service: Service) -> bool:
        """Take this stub's messages until it goes away (False) or asks the core to stop (True)."""
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                self.gone = True
                return False
            if isinstance(message, Submit):
                sink = _CoreSink(message.key, self)
                try:
                    service.submit(message.request, message.request_id, sink)
                except Exception as exc:
                    sink.fail(exc)
            elif isinstance(message, Cancel):
                self.cancelled.add(message.key)
            else:
                self.gone = True
                return True

    def close(self) -> None:
        self.outgoing.close()
        self.connection.close()


class _Stubs:
    """Every stub connected to the core, for the status reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connected: list[_StubConnection] = []

    def add(self, stub: _StubConnection) -> None:
        with self._lock:
            self._connected.append(stub)

    def remove(self, stub: _StubConnection) -> None:
        with self._lock:
            self._connected.remove(stub)

    def report(self, status: Status) -> None:
        with self._lock:
            connected = list(self._connected)
        for stub in connected:
            stub.outgoing.put(status)


def run_core(settings: EngineSettings, connection: Connection, listen_at: str | None = None) -> None:
    """The core's main: start the engine, serve the stub's messages until it stops or goes away;
    with ``listen_at``, also serve the stubs that connect to that Unix socket."""
    from backend.assembly import start_in_process  # the child imports the engine, not the stub
    from llgtriton.logs import configure_logging

    configure_logging(os.environ.get("LLGTRITON_LOG_LEVEL", "info"))
    # The core lives as long as its stub: a signal to Triton's process group is the stub's to handle
    # (it stops the core); a stub that dies closes the pipe, which ends the core.
    if threading.current_thread() is threading.main_thread():  # (the tests run it on a thread)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        # Responses cost nothing here (a list append); the stub's own pump merges them.
        service = start_in_process(settings.model_copy(update={"coalesce_responses": False}))
        listener = _listen(listen_at) if listen_at is not None else None
    except Exception as exc:
        logger.exception("the engine could not start")
        connection.send(Failed(f"{type(exc).__name__}: {exc}"))
        return
    stubs = _Stubs()
    starter = _StubConnection(connection)
    stubs.add(starter)
    stop = threading.Event()
    status = threading.Thread(target=_report, args=(service, stubs, stop), name="llgtriton-core-status", daemon=True)
    status.start()
    if listener is not None:
        accept = threading.Thread(target=_accept, args=(listener, service, stubs), name="llgtriton-core-accept")
        accept.daemon = True
        accept.start()
    connection.send(Ready(os.getpid()))
    try:
        starter.serve(service)
    finally:
        stop.set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        service.shutdown()
        starter.close()


def _listen(address: str) -> Listener:
    with contextlib.suppress(FileNotFoundError):  # a core that died left it; the stub holding the lock decides
        Path(address).unlink()
    return Listener(address, family="AF_UNIX")


def _accept(listener: Listener, service: Service, stubs: _Stubs) -> None:
    while True:
        try:
            connection = listener.accept()
        except OSError:  # closed: the core stops
            return
        threading.Thread(target=_serve_joined, args=(connection, service, stubs), daemon=True).start()


def _serve_joined(connection: Connection, service: Service, stubs: _Stubs) -> None:
    """A stub that joined the core: served until it goes away; its going does not stop the core."""
    stub = _StubConnection(connection)
    try:
        connection.send(Ready(os.getpid()))
    except OSError:
        return
    stubs.add(stub)
    logger.info("a model instance joined the engine process")
    try:
        stub.serve(service)
    finally:
        stubs.remove(stub)
        stub.close()


def _report(service: Service, stubs: _Stubs, stop: threading.Event) -> None:
    while not stop.wait(STATUS_INTERVAL_S):
        running, waiting = service.load()
        stubs.report(Status(running, waiting, service.step_counters.totals()))
