"""Stop strings: cut the text before the first stop string, and hold back what could start one."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringFilter:
    """Streams text through, never releasing a stop string or a prefix of one too early.

    ``push`` returns the text that is safe to emit and whether a stop string was found; text
    that ends with a prefix of some stop string is held until it can be decided. ``flush``
    releases the held text when generation ends for another reason.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        buffer = self._held + text
        hits = [index for index in (buffer.find(stop) for stop in self._stops) if index >= 0]
        if hits:
            self._held = ""
            return buffer[: min(hits)], True
        keep = self._longest_partial_stop(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def _longest_partial_stop(self, buffer: str) -> int:
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
