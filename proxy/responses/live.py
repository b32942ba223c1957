"""The events of a streamed background response while its proxy runs it: readers on that proxy (the
client that created it, one that resumes) follow them as they are made, without waiting for the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from proxy.responses.output import ResponseEvent

# The events after which a stream has nothing more to say.
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class LiveEvents:
    """An append-only list of events and a signal for each addition; ``end`` when no more will come."""

    def __init__(self) -> None:
        self._events: list[ResponseEvent] = []
        self._ended = False
        self._grown = asyncio.Event()

    def add(self, events: list[ResponseEvent]) -> None:
        if not events:
            return
        self._events += events
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()

    def since(self, index: int) -> list[ResponseEvent]:
        """The events from position ``index`` on (what the store has not been sent yet)."""
        return self._events[index:]

    def __len__(self) -> int:
        return len(self._events)

    async def follow(self, after: int) -> AsyncGenerator[ResponseEvent]:
        """The events numbered above ``after``, as they come, until the log ends."""
        index = 0
        while True:
            grown = self._grown
            while index < len(self._events):
                event = self._events[index]
                index += 1
                if event.sequence_number > after:
                    yield event
            if self._ended:
                return
            await grown.wait()
