"""Responses sent from one thread, a request's pending tokens merged into one response when it falls behind.

Inside Triton, every response and every cancellation check is a round trip from the python
backend's stub to the server (about 0.4 ms and 0.1 ms on the 2-core CI machine). Made on the
engine's thread, a step at batch 128 spends tens of milliseconds on them, and the stub's cap of a
few thousand responses a second becomes a cap on tokens a second.

The pump moves that traffic off the engine's thread:
- ``send`` and ``fail`` only queue; one thread sends the queue, each request's responses in
  order. The round trips release the GIL, so the engine steps on meanwhile.
- When the thread keeps up, every output is its own response, as before. When it falls behind,
  a request's queued outputs leave as one response: texts joined, logprobs joined, the latest
  token counts and finish reason. The number of responses a second then caps requests, not
  tokens.
- ``is_cancelled`` reads a flag that the thread refreshes for every request not yet finished,
  at most every ``check_interval_s``, stalest first. So that checks never crowd out responses
  (a full queue holds a thousand requests), a pass checks at most as many requests as it sent
  responses, or ``MIN_CHECKS_PER_PASS``. The engine sees a cancellation at its next step after
  the check.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from backend.contract import ResponseSink, deliver, deliver_failure, is_cancelled
from llgtriton.settings import EngineSettings
from llgtriton.wire import GenerationOutput

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.01  # how stale a request's cancellation flag may get while the pump keeps up
MIN_CHECKS_PER_PASS = 16
_JOIN_TIMEOUT_S = 10.0


def merged(outputs: Sequence[GenerationOutput]) -> GenerationOutput:
    """One response covering ``outputs``, consecutive responses of one request: the last one's finish
    and counts, every one's text (the answer's and the thinking's) and token logprobs, and what only
    a request's first response carries (the formats of its calls and thinking, the prompt's
    logprobs) from the first."""
    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0]
    logprobs = None
    if any(output.logprobs is not None for output in outputs):
        logprobs = tuple(entry for output in outputs for entry in output.logprobs or ())
    return dataclasses.replace(
        outputs[-1],
        text="".join(output.text for output in outputs),
        reasoning="".join(output.reasoning for output in outputs),
        logprobs=logprobs,
        prompt_logprobs=first.prompt_logprobs,
        tool_call_format=first.tool_call_format,
        reasoning_format=first.reasoning_format,
    )


@dataclass(eq=False)
class _Outbox:
    """One request's queued responses and what the pump knows of it."""

    sink: ResponseSink
    request_id: str
    outputs: list[GenerationOutput] = field(default_factory=list)
    final: bool = False  # the last queued output ends the request
    error: Exception | None = None  # queued failure: ends the request after the outputs
    closed: bool = False  # a final response or a failure is queued: nothing more is accepted
    cancelled: bool = False
    checked: float = float("-inf")  # when the pump last asked the sink whether it was cancelled

    def take(self) -> tuple[list[GenerationOutput], bool, Exception | None]:
        taken = self.outputs, self.final, self.error
        self.outputs, self.final, self.error = [], False, None
        return taken


class PumpedSink:
    """A :class:`ResponseSink` whose calls return at once; the pump does the sending."""

    def __init__(self, pump: ResponsePump, outbox: _Outbox) -> None:
        self._pump = pump
        self._outbox = outbox

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        self._pump.queue(self._outbox, output, final=final)

    def fail(self, error: Exception) -> None:
        self._pump.queue(self._outbox, None, error=error)

    def is_cancelled(self) -> bool:
        return self._outbox.cancelled

    def discard(self) -> None:
        """Forget a request that was refused before anything was queued for it."""
        self._pump.discard(self._outbox)


class ResponsePump:
    def __init__(self, check_interval_s: float = CHECK_INTERVAL_S) -> None:
        self._check_interval_s = check_interval_s
        self._changed = threading.Condition()
        self._ready: dict[_Outbox, None] = {}  # outboxes with something to send, in the order they got it
        self._open: dict[_Outbox, None] = {}  # requests not finished: their cancellation is checked
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llgtriton-responses", daemon=True)
        self._thread.start()

    def wrap(self, sink: ResponseSink, request_id: str) -> PumpedSink:
        outbox = _Outbox(sink, request_id)
        with self._changed:
            self._open[outbox] = None
            self._changed.notify()  # its first cancellation check is due now
        return PumpedSink(self, outbox)

    def discard(self, outbox: _Outbox) -> None:
        with self._changed:
            self._open.pop(outbox, None)

    def queue(
        self, outbox: _Outbox, output: GenerationOutput | None, *, final: bool = False, error: Exception | None = None
    ) -> None:
        with self._changed:
            if outbox.closed:
                logger.warning("a response after the request ended was dropped")
                return
            if output is not None:
                outbox.outputs.append(output)
            outbox.final, outbox.error = final, error
            outbox.closed = final or error is not None
            self._ready[outbox] = None
            self._changed.notify()

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        with self._changed:
            self._stopping = True
            self._changed.notify()
        self._thread.join(_JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("responses were still being sent %.0f s after shutdown began", _JOIN_TIMEOUT_S)

    # Pump thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._ready and not self._stopping:
                    wait = self._next_check_in()
                    if wait is not None and wait <= 0:
                        break
                    self._changed.wait(wait)
                if self._stopping and not self._ready:
                    return
                work = [(outbox, outbox.take()) for outbox in self._ready]
                self._ready.clear()
                for outbox, (_, final, error) in work:
                    if final or error is not None:
                        self._open.pop(outbox, None)
                due = self._due(max(MIN_CHECKS_PER_PASS, len(work)))
            for outbox, (outputs, final, error) in work:
                self._deliver(outbox.sink, outputs, final, error)
            self._check(due)

    def _next_check_in(self) -> float | None:
        """Seconds until the stalest open request's check is due; None with no open request."""
        if not self._open:
            return None
        return min(outbox.checked for outbox in self._open) + self._check_interval_s - time.monotonic()

    def _due(self, most: int) -> list[_Outbox]:
        """The open requests whose check is due, at most ``most`` of them, stalest first."""
        now = time.monotonic()
        due = [outbox for outbox in self._open if now - outbox.checked >= self._check_interval_s]
        return heapq.nsmallest(most, due, key=lambda outbox: outbox.checked)

    @staticmethod
    def _deliver(sink: ResponseSink, outputs: list[GenerationOutput], final: bool, error: Exception | None) -> None:
        if outputs:
            deliver(sink, merged(outputs), final=final)
        if error is not None:
            deliver_failure(sink, error)

    @staticmethod
    def _check(due: list[_Outbox]) -> None:
        for outbox in due:
            outbox.cancelled = outbox.cancelled or is_cancelled(outbox.sink, outbox.request_id)
            outbox.checked = time.monotonic()


def pump_for(settings: EngineSettings) -> ResponsePump | None:
    """A pump where ``--engine-coalesce-responses`` asks for one; None: each response is sent as it comes."""
    return ResponsePump() if settings.coalesce_responses else None
