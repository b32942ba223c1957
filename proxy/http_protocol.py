"""uvicorn's httptools protocol with the limits it lacks against slow or oversized clients.

uvicorn waits for a request's headers forever, buffers headers of any size and answers malformed
requests in plain text. Here a connection gets ``header_timeout_s`` to send its request line and
headers (408), at most ``max_header_bytes`` of them (431), the process holds at most
``max_connections`` connections (503), and these refusals and malformed requests are
``proxy.errors`` errors like every other, with the same body and headers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from llgtriton.settings import ProxySettings
from proxy.errors import (
    HeadersTooLargeError,
    InvalidRequestError,
    ProxyError,
    RequestTimeoutError,
    ServiceUnavailableError,
    raw_http_response,
)


class _HeadersTooLarge(Exception):
    pass


def guarded_protocol(settings: ProxySettings) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` option, with ``settings``' limits."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_headers = False
            self._header_bytes = 0
            self._parsed_header_bytes = 0
            self._header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > settings.max_connections:
                self._refuse(ServiceUnavailableError(f"more than {settings.max_connections} open connections"))
                return
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_deadline()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._header_deadline is None and not self._in_headers and self._between_requests():
                self._await_headers()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self._in_headers:  # headers still incomplete after this chunk: count all of it
                self._header_bytes += len(data)
                if self._header_bytes > settings.max_header_bytes:
                    self._headers_too_large()

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_header_bytes(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_header_bytes(self, count: int) -> None:
            """Headers that arrive whole in one chunk: refused before the request reaches the app."""
            self._parsed_header_bytes += count
            if self._parsed_header_bytes > settings.max_header_bytes:
                raise _HeadersTooLarge  # httptools stops parsing; send_400_response then answers 431

        def _headers_too_large(self) -> None:
            limit = settings.max_header_bytes
            self._refuse(HeadersTooLargeError(f"the request line and headers exceed {limit} bytes"))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True
            self._header_bytes = 0
            self._parsed_header_bytes = 0

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._stop_deadline()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if self._parsed_header_bytes > settings.max_header_bytes:
                self._headers_too_large()
            else:
                self._refuse(InvalidRequestError(f"malformed HTTP request: {msg}"))

        def _await_headers(self) -> None:
            self._stop_deadline()
            self._header_deadline = self.loop.call_later(settings.header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if self._in_headers or self._between_requests():  # not while a body is on its way (body_timeout_s)
                seconds = settings.header_timeout_s
                self._refuse(RequestTimeoutError(f"the request's headers did not arrive within {seconds:g} s"))

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _stop_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _refuse(self, error: ProxyError) -> None:
            self._stop_deadline()
            if not self.transport.is_closing():
                self.transport.write(raw_http_response(error))
                self.transport.close()

    return GuardedHttpToolsProtocol
