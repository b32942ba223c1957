"""Stop strings: cut the text before the first stop string, and hold back what could start one."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class StopStringFilter:
    """Streams text through, never releasing a stop string or a prefix of one too early.

    ``push`` returns the text that is safe to emit and whether a stop string was found; text
    that ends with a prefix of some stop string is held until it can be decided. ``flush``
    releases the held text when generation ends for another reason.

    ``may_stop``, when set, is asked for each stop string found, with the text before it in this
    push's buffer: where it says no, the stop string is text like any other (a constrained output
    ends only where its grammar accepts it, :mod:`backend.output_grammar`).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.may_stop: Callable[[str], bool] | None = None

    def push(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        buffer = self._held + text
        start = 0
        while (hit := self._first_stop(buffer, start)) >= 0:
            if self.may_stop is None or self.may_stop(buffer[:hit]):
                self._held = ""
                return buffer[:hit], True
            start = hit + 1
        keep = self._longest_partial_stop(buffer, start)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def _first_stop(self, buffer: str, start: int) -> int:
        hits = [index for index in (buffer.find(stop, start) for stop in self._stops) if index >= 0]
        return min(hits, default=-1)

    def _longest_partial_stop(self, buffer: str, start: int) -> int:
        """Characters at the end of ``buffer``, after ``start``, that begin some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer) - start), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
