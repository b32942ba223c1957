"""Server-sent events framing: ``data: <json>`` per chunk, an error event on failure, ``[DONE]`` last."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from pydantic import BaseModel

from proxy.errors import sse_event

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def frame(chunk: BaseModel) -> bytes:
    return b"data: " + chunk.model_dump_json(exclude_none=False).encode() + b"\n\n"


async def event_stream(first: BaseModel, rest: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    """Frame ``first`` and then ``rest``; an error mid-stream becomes an error event before [DONE]."""
    try:
        yield frame(first)
        async for chunk in rest:
            yield frame(chunk)
    except Exception as exc:
        logger.warning("stream failed: %s", exc)
        yield sse_event(exc)
    finally:
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()
    yield DONE
