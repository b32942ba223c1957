"""What the tests and the benchmarks share: a real llgtriton server on free ports, and a sink that records
a request's outputs as the backend sends them.

``start_server`` runs ``llgtriton serve`` exactly as ``make serve`` does (Triton and the proxy);
``start_process`` any ``llgtriton`` command, waiting until it answers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llgtriton.wire import GenerationOutput

ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 600.0
STORE_FLAG = "--proxy-responses-store={0.parent}/responses.sqlite3"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class RunningServer:
    process: subprocess.Popen[bytes]
    log: Path
    proxy_port: int
    grpc_port: int
    http_port: int
    metrics_port: int

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}/v1"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ServerNotReady(RuntimeError):
    """A started command exited, or did not answer in time; the message ends with its log's tail."""


def spawn(log: Path, argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m launcher.cli <argv>`` in its own session, its output in ``log``; returns at once."""
    with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "launcher.cli", *argv],
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )


def wait_until_ready(
    url: str, process: subprocess.Popen[bytes], log: Path | None = None, timeout: float = SERVER_START_TIMEOUT_S
) -> None:
    """Until ``url`` answers 200; raises :class:`ServerNotReady` when ``process`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not _ready(url):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = f":\n{log_tail(log)}" if log is not None else ""
            raise ServerNotReady(f"{process.args!r} did not become ready at {url}{tail}")
        time.sleep(0.5)


def start_process(
    log: Path, argv: Sequence[str], ready_url: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """:func:`spawn`, then wait until ``ready_url`` answers 200 (stopping it if it never does)."""
    process = spawn(log, argv, env)
    try:
        wait_until_ready(ready_url, process, log)
    except ServerNotReady:
        stop_process(process)
        raise
    return process


def triton_ports_argv(http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
    return [
        f"--triton-http-port={http_port}",
        f"--triton-grpc-port={grpc_port}",
        f"--triton-metrics-port={metrics_port}",
        f"--triton-model-repository={ROOT / 'model_repository'}",
    ]


def start_server(log: Path, *extra: str) -> RunningServer:
    """``llgtriton serve`` exactly as ``make serve`` runs it, on free ports, with a Responses store of its
    own beside ``log`` unless ``extra`` names one: a server the user keeps running (``make serve``)
    never shares its stored responses with the tests' servers."""
    ports = [free_port() for _ in range(4)]
    proxy_port, http_port, grpc_port, metrics_port = ports
    own_store = [] if any(arg.startswith("--proxy-responses-store") for arg in extra) else [STORE_FLAG.format(log)]
    argv = [
        "serve",
        f"--proxy-port={proxy_port}",
        f"--proxy-triton-url=127.0.0.1:{grpc_port}",
        *triton_ports_argv(http_port, grpc_port, metrics_port),
        *own_store,
        *extra,
    ]
    process = start_process(log, argv, f"http://127.0.0.1:{proxy_port}/ready")
    return RunningServer(process, log, proxy_port, grpc_port, http_port, metrics_port)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 60.0, signum: int = signal.SIGINT) -> int:
    """Ctrl-C, as a user would (or ``signum``: SIGTERM, as docker and Kubernetes do); returns the exit code."""
    if process.poll() is None:
        process.send_signal(signum)
    try:
        return process.wait(timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stop_server(server: RunningServer, timeout: float = 60.0) -> int:
    return stop_process(server.process, timeout)


class RecordingSink:
    """A ResponseSink that keeps every output with the time it came (``stamps``: (seconds, tokens so
    far)), optionally hands each to ``on_output``, and cancels after ``cancel_after`` outputs."""

    def __init__(
        self, cancel_after: int | None = None, on_output: Callable[[GenerationOutput], None] | None = None
    ) -> None:
        self.submitted = time.perf_counter()
        self.outputs: list[GenerationOutput] = []
        self.stamps: list[tuple[float, int]] = []
        self.error: Exception | None = None
        self.done = threading.Event()
        self._cancel_after = cancel_after
        self._on_output = on_output

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        assert not self.done.is_set(), "a response after the final one"
        self.stamps.append((time.perf_counter(), output.completion_tokens))
        self.outputs.append(output)
        if self._on_output is not None:
            self._on_output(output)
        if final:
            self.done.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()

    def is_cancelled(self) -> bool:
        return self._cancel_after is not None and len(self.outputs) >= self._cancel_after

    def wait(self, timeout: float = 120.0) -> None:
        assert self.done.wait(timeout), "the request never finished"

    @property
    def text(self) -> str:
        return "".join(o.text for o in self.outputs)
