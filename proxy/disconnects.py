"""Cancelling a request's work when its client hangs up, with one watcher task per request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.types import Receive

from proxy.errors import ClientDisconnectedError

logger = logging.getLogger(__name__)


async def _disconnect(receive: Receive) -> None:
    """Return when the client hangs up (the body has been read: the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


@asynccontextmanager
async def cancelled_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Run the body; if the client hangs up first, cancel it and raise :class:`ClientDisconnectedError`.

    A whole response, or a stream's first chunk, can wait long (the request may be queued); a client
    that gave up must not keep its generation running. The body runs in the caller's task, so
    cancelling it closes the Triton stream, and the backend frees the request at its next step.
    A cancellation from elsewhere (the server stopping) passes through unchanged.
    """
    task = asyncio.current_task()
    assert task is not None, "cancelled_on_disconnect runs inside a task"
    cancelling = task.cancelling()
    active, hung_up = True, False

    def hang_up(watcher: asyncio.Future[None]) -> None:
        nonlocal hung_up
        if active and not watcher.cancelled() and watcher.exception() is None:
            hung_up = True
            task.cancel()

    watcher = asyncio.ensure_future(_disconnect(receive))
    watcher.add_done_callback(hang_up)
    try:
        yield
    except asyncio.CancelledError:
        if hung_up and task.uncancel() <= cancelling:
            logger.info("client disconnected; its generation was cancelled")
            raise ClientDisconnectedError("the client disconnected") from None
        raise
    finally:
        active = False
        watcher.cancel()
