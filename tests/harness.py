"""A real llgtriton server for the tests: ``llgtriton serve`` (Triton and the proxy) on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 600.0


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

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_process(log: Path, argv: list[str], ready_url: str) -> subprocess.Popen[bytes]:
    """Start ``python -m launcher.cli <argv>`` in its own session; wait until ``ready_url`` answers 200."""
    with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "launcher.cli", *argv],
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not _ready(ready_url):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            pytest.fail(f"llgtriton {argv[0]} did not become ready:\n{log_tail(log)}")
        time.sleep(0.5)
    return process


def triton_ports_argv(http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
    return [
        f"--triton-http-port={http_port}",
        f"--triton-grpc-port={grpc_port}",
        f"--triton-metrics-port={metrics_port}",
        f"--triton-model-repository={ROOT / 'model_repository'}",
    ]


def start_server(log: Path, *extra: str) -> RunningServer:
    """``llgtriton serve`` exactly as ``make serve`` runs it, on free ports."""
    ports = [free_port() for _ in range(4)]
    proxy_port, http_port, grpc_port, metrics_port = ports
    argv = [
        "serve",
        f"--proxy-port={proxy_port}",
        f"--proxy-triton-url=127.0.0.1:{grpc_port}",
        *triton_ports_argv(http_port, grpc_port, metrics_port),
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
