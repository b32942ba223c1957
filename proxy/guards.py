"""ASGI middleware in front of the routes: API keys, then the limit on concurrent generations.

Both answer through ``proxy.errors.http_response``, like every other error. Keys are compared
in constant time (``hmac.compare_digest`` against every accepted key, no early exit) and never
logged. Liveness, readiness and metrics stay open, so probes and scrapers need no key.
"""

from __future__ import annotations

import ctypes
import hmac
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import AuthenticationError, RateLimitError, http_response

logger = logging.getLogger(__name__)

PROTECTED_PREFIX = "/v1/"
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})


def _bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
    return None


class ApiKeyGuard:
    def __init__(self, app: ASGIApp, keys: list[bytes]) -> None:
        self._app = app
        self._keys = keys

    def _valid(self, token: bytes) -> bool:
        matched = False
        for key in self._keys:  # every key compared: the time does not say which one came close
            matched |= hmac.compare_digest(token, key)
        return matched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            await self._app(scope, receive, send)
            return
        token = _bearer_token(scope)
        if token is None:
            error = AuthenticationError("missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        elif not self._valid(token):
            error = AuthenticationError("invalid API key", code="invalid_api_key")
        else:
            await self._app(scope, receive, send)
            return
        await http_response(error)(scope, receive, send)


class InFlightCount(Protocol):
    """How many generations are in flight, in this process or in all the proxy's processes."""

    def total(self) -> int: ...

    def add(self, delta: int) -> None: ...


class LocalInFlight:
    def __init__(self) -> None:
        self._count = 0

    def total(self) -> int:
        return self._count

    def add(self, delta: int) -> None:
        self._count += delta


class SharedInFlight:
    """One slot per proxy process in shared memory: each writes only its own, and reads the sum.

    No lock: two processes admitting at the same instant can each see room for one more, so the
    limit can be passed by at most one request per other process, for as long as those requests last.
    A process that dies leaves its slot to the supervisor, which zeroes it before starting the next.
    """

    def __init__(self, slots: ctypes.Array[ctypes.c_long], index: int) -> None:
        self._slots = slots
        self._index = index

    def total(self) -> int:
        return sum(self._slots)

    def add(self, delta: int) -> None:
        self._slots[self._index] += delta


class ConcurrencyGuard:
    """At most ``limit`` generation requests at once, counted until their last byte is sent."""

    def __init__(self, app: ASGIApp, limit: int, in_flight: InFlightCount | None = None) -> None:
        self._app = app
        self._limit = limit
        self._in_flight = LocalInFlight() if in_flight is None else in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_PATHS:
            await self._app(scope, receive, send)
            return
        in_flight = self._in_flight.total()
        if in_flight >= self._limit:
            logger.info("refused a request: %d of %d in flight", in_flight, self._limit)
            error = RateLimitError(
                f"the server is handling its limit of {self._limit} requests; retry later", code="rate_limit_exceeded"
            )
            await http_response(error)(scope, receive, send)
            return
        self._in_flight.add(1)
        try:
            await self._app(scope, receive, send)
        finally:
            self._in_flight.add(-1)


class GenerationSlots:
    """The concurrency limit as the generations count: ``n`` choices hold ``n`` slots, and a background
    response holds one while it runs, though its HTTP request returned at once.

    The guard counts each request once, as it arrives; what a request holds beyond that is taken
    here, once the request is read: past the limit it is refused with a 429 like any other.
    """

    def __init__(self, limit: int | None, in_flight: InFlightCount) -> None:
        self._limit = limit
        self._in_flight = in_flight

    @contextmanager
    def beyond_the_request(self, count: int) -> Iterator[None]:
        """Hold ``count`` slots more than the request's own while the block runs."""
        if self._limit is None or count <= 0:
            yield
            return
        in_flight = self._in_flight.total()
        if in_flight + count > self._limit:
            logger.info("refused a request needing %d more slots: %d of %d in flight", count, in_flight, self._limit)
            raise RateLimitError(
                f"the request needs {count + 1} of the server's {self._limit} concurrent generations and "
                f"{in_flight} are in use; retry later",
                code="rate_limit_exceeded",
            )
        self._in_flight.add(count)
        try:
            yield
        finally:
            self._in_flight.add(-count)

    def handed_over(self) -> Callable[[], None]:
        """Hold one slot for work that outlives its request (a background response), from now on: the
        request's own, which it hands over as it returns. Returns what frees it (call it once)."""
        if self._limit is None:
            return lambda: None
        self._in_flight.add(1)
        return lambda: self._in_flight.add(-1)
