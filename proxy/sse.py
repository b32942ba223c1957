"""Server-sent events: ``data: <json>`` per chunk, an error event on failure, ``[DONE]`` last; or,
for the Responses API, ``event: <type>`` before each event's data and no ``[DONE]``.

:class:`EventStreamResponse` waits for the first chunk before it sends its headers, so a request
refused before then still gets a proper HTTP status; after that, failures become error events.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.disconnects import cancelled_on_disconnect
from proxy.errors import ClientDisconnectedError, ProxyError, as_proxy_error, error_body, sse_event

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
_HEADERS: Mapping[str, str] = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(chunk: BaseModel) -> bytes:
    return b"data: " + chunk.model_dump_json(exclude_none=False).encode() + b"\n\n"


def named_frame(event: BaseModel) -> bytes:
    """A Responses event: its type as the SSE event name, then its data."""
    kind = str(getattr(event, "type", "message"))
    return b"event: " + kind.encode() + b"\n" + frame(event)


def named_error(error: BaseException, sequence_number: int) -> bytes:
    """A failure the Responses stream did not report itself, as its ``error`` event (numbered next)."""
    body = error_body(as_proxy_error(error))["error"]
    data = {"type": "error", "sequence_number": sequence_number, **{k: body[k] for k in ("code", "message", "param")}}
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


class EventStreamResponse(Response):
    """Streams ``chunks`` as server-sent events from the request's own task.

    One watcher task per request notices a client that hangs up, before or during the stream, and
    cancels the generation (Starlette's streaming response would add a task group and two tasks).
    """

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncGenerator[BaseModel], *, named: bool = False, may_be_empty: bool = False) -> None:
        """``may_be_empty``: a stream with no event is an answer (a resumed one that had ended), not an error."""
        self.status_code = 200
        self.background = None
        self.init_headers(_HEADERS)
        self._chunks = chunks
        self._named = named
        self._may_be_empty = may_be_empty
        self._frame = named_frame if named else frame
        self._done = b"" if named else DONE
        self._next_sequence = 0  # a Responses stream's: the error event an unreported failure gets

    def _framed(self, chunk: BaseModel) -> bytes:
        self._next_sequence = int(getattr(chunk, "sequence_number", self._next_sequence - 1)) + 1
        return self._frame(chunk)

    def _error(self, error: BaseException) -> bytes:
        return named_error(error, self._next_sequence) if self._named else sse_event(error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False
        try:
            async with aclosing(self._chunks), cancelled_on_disconnect(receive):
                try:
                    first: BaseModel | None = await anext(self._chunks)
                except StopAsyncIteration:
                    if not self._may_be_empty:
                        raise ProxyError("the generation produced no output") from None
                    first = None
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                started = True
                await self._stream(first, send)
        except ClientDisconnectedError:
            if not started:
                raise  # answered 499, for the logs and metrics

    async def _stream(self, first: BaseModel | None, send: Send) -> None:
        """``first`` and the rest; an error mid-stream becomes an error event before [DONE]."""
        try:
            if first is not None:
                await send({"type": "http.response.body", "body": self._framed(first), "more_body": True})
            async for chunk in self._chunks:
                await send({"type": "http.response.body", "body": self._framed(chunk), "more_body": True})
        except Exception as exc:
            logger.warning("stream failed: %s", exc)
            await send({"type": "http.response.body", "body": self._error(exc), "more_body": True})
        await send({"type": "http.response.body", "body": self._done, "more_body": False})
