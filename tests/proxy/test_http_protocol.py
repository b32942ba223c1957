"""Slow, oversized and malformed HTTP against a real ``llgtriton proxy`` process (no Triton behind it).

Each gets a JSON error with its own status (408, 431, 400, 503) within its bound, and the proxy
keeps answering everyone else meanwhile.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.harness import free_port, start_process, stop_process

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_HEADER_BYTES = 4096
MAX_CONNECTIONS = 40


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    argv = [
        "proxy",
        f"--proxy-port={port}",
        f"--proxy-triton-url=127.0.0.1:{free_port()}",  # nothing listens there: these tests need no model
        f"--proxy-header-timeout-s={HEADER_TIMEOUT_S}",
        f"--proxy-body-timeout-s={BODY_TIMEOUT_S}",
        f"--proxy-max-header-bytes={MAX_HEADER_BYTES}",
        f"--proxy-max-connections={MAX_CONNECTIONS}",
    ]
    process: subprocess.Popen[bytes] = start_process(
        tmp_path_factory.mktemp("proxy") / "proxy.log", argv, f"http://127.0.0.1:{port}/health"
    )
    yield port
    stop_process(process)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def response_of(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """Status and JSON body of the next response on ``sock`` (read by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"application/json" in head.lower()
    length = int(
        next(line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")).split(b":")[1]
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of the body"
        body += chunk
    return int(head.split(b" ", 2)[1]), json.loads(body)


def healthy(port: int) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


def test_headers_that_never_finish_get_408_and_others_are_served(proxy: int) -> None:
    slow = [connect(proxy) for _ in range(20)]
    for sock in slow:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    assert healthy(proxy)
    started = time.monotonic()
    for sock in slow:
        status, body = response_of(sock)
        assert status == 408 and "headers" in str(body["error"])
        sock.close()
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 5


def test_a_silent_connection_is_closed_with_408(proxy: int) -> None:
    with connect(proxy) as sock:
        assert response_of(sock)[0] == 408


def test_a_body_shorter_than_its_content_length_gets_408(proxy: int) -> None:
    with connect(proxy) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": '
        )
        started = time.monotonic()
        status, body = response_of(sock)
        assert time.monotonic() - started < BODY_TIMEOUT_S + 5
    assert status == 408 and "body" in str(body["error"])


def test_headers_over_the_limit_get_431(proxy: int) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 * MAX_HEADER_BYTES) + b"\r\n\r\n")
        status, body = response_of(sock)
    assert status == 431 and str(MAX_HEADER_BYTES) in str(body["error"])
    assert healthy(proxy)


def test_malformed_http_gets_a_json_400(proxy: int) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, body = response_of(sock)
    assert status == 400 and "malformed" in str(body["error"])


def test_connections_beyond_the_limit_get_503(proxy: int) -> None:
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = connect(proxy)
            held.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert response_of(sock)[0] == 200  # accepted and counted; kept alive for the next request
        with connect(proxy) as extra:
            status, _ = response_of(extra)
        assert status == 503
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert healthy(proxy)


def test_the_limits_are_settings() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "proxy", "--help"], capture_output=True, text=True, check=True
    )
    for flag in (
        "--proxy-header-timeout-s",
        "--proxy-body-timeout-s",
        "--proxy-max-header-bytes",
        "--proxy-max-connections",
    ):
        assert flag in result.stdout
