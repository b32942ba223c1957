"""A minimal HTTP/1.1 client for streamed completions, so the load generator's own cost stays small.

``httpx`` (under the OpenAI SDK) spends a few hundred microseconds of Python per request and per
read; in a benchmark of what the proxy adds, that cost sits on the proxy's side of the ledger
although a direct gRPC client does not pay it. This client writes one prepared request and reads
the chunked response with ``asyncio`` streams, looking only at the status line, the headers it needs
and the chunk framing; each chunk the proxy sends is one server-sent event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field


class RawHttpError(OSError):
    """A response that is not a 200 stream, or a connection that broke mid-response."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


def _status_and_headers(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """The status code and the lower-cased headers of a response head."""
    status_line, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        key, _, value = line.partition(b":")
        headers[key.strip().lower()] = value.strip().lower()
    return int(status_line.split(b" ", 2)[1]), headers


@dataclass
class RawSsePool:
    """Keep-alive connections to one server, reused across requests (one per concurrent request)."""

    host: str
    port: int
    _idle: list[_Connection] = field(default_factory=list)

    def request(self, path: str, body: dict[str, object]) -> bytes:
        """The bytes of a JSON POST, prepared once and sent as many times as needed."""
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode() + payload

    async def stream(self, request: bytes, on_chunk: Callable[[bytes], None]) -> None:
        """Send ``request`` and call ``on_chunk`` with each chunk of the response body as it arrives."""
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._open()
        try:
            head = await self._send(connection, request)
        except (OSError, asyncio.IncompleteReadError):
            connection.close()
            if not reused:
                raise
            connection = await self._open()  # the server closed an idle keep-alive connection
            head = await self._send(connection, request)
        try:
            keep = await self._read_body(connection, head, on_chunk)
        except BaseException:
            connection.close()
            raise
        if keep:
            self._idle.append(connection)
        else:
            connection.close()

    async def _open(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Connection(reader, writer)

    @staticmethod
    async def _send(connection: _Connection, request: bytes) -> bytes:
        connection.writer.write(request)
        return await connection.reader.readuntil(b"\r\n\r\n")

    @staticmethod
    async def _read_body(connection: _Connection, head: bytes, on_chunk: Callable[[bytes], None]) -> bool:
        """Read the body after ``head``; True when the connection can be reused."""
        reader = connection.reader
        status, headers = _status_and_headers(head)
        keep = headers.get(b"connection") != b"close"
        if headers.get(b"transfer-encoding") != b"chunked":
            length = int(headers.get(b"content-length") or 0)
            body = await reader.readexactly(length)
            if status != 200:
                raise RawHttpError(f"HTTP {status}: {body[:200]!r}")
            on_chunk(body)
            return keep
        failed = status != 200
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            data = (await reader.readexactly(size + 2))[:-2]
            if failed:
                raise RawHttpError(f"HTTP {status}: {data[:200]!r}")
            on_chunk(data)
        await reader.readexactly(2)  # the empty trailer
        return keep

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
