"""What ``model.py`` serves through, and what every engine answers to.

:class:`Service` takes Triton's requests; :class:`ResponseSink` takes one request's responses.
Sending to a sink goes through :func:`deliver` and :func:`deliver_failure`, so that a client who is
gone never stops the engine. Nothing here imports torch or a tokenizer: a stub whose engine runs in
a process of its own (``backend.core_process``) loads only this side.
"""

from __future__ import annotations

import logging
from typing import Protocol

from backend.telemetry import StepCounters
from llgtriton.wire import GenerationOutput, GenerationRequest

logger = logging.getLogger(__name__)


class ResponseSink(Protocol):
    """Where one request's responses go (a Triton response sender in production)."""

    def send(self, output: GenerationOutput, *, final: bool) -> None: ...

    def fail(self, error: Exception) -> None: ...

    def is_cancelled(self) -> bool: ...


class Service(Protocol):
    """What Triton's model (``model.py``) serves requests through: ``GenerationService``, the
    synthetic engine's service, or either of them in a process of its own (``CoreProcess``)."""

    @property
    def step_counters(self) -> StepCounters: ...

    @property
    def reports_engine(self) -> bool:
        """Whether this instance publishes the engine's metrics: not one that joined an engine process
        another instance started, so that a shared engine is counted once."""
        ...

    def load(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        ...

    def submit(self, request: GenerationRequest, request_id: str, sink: ResponseSink) -> None: ...

    def health(self) -> None:
        """Raise ``Unavailable`` when the engine cannot take requests now (restarting, stuck)."""
        ...

    def shutdown(self) -> None: ...


def deliver(sink: ResponseSink, output: GenerationOutput, *, final: bool) -> None:
    """Send a response; a client that is gone does not stop the engine."""
    try:
        sink.send(output, final=final)
    except Exception:
        logger.warning("could not deliver a response", exc_info=True)


def deliver_failure(sink: ResponseSink, error: Exception) -> None:
    try:
        sink.fail(error)
    except Exception:
        logger.exception("could not report an error")


def is_cancelled(sink: ResponseSink, request_id: str) -> bool:
    """Whether the client gave up; a sink that cannot tell counts as cancelled."""
    try:
        return sink.is_cancelled()
    except Exception:
        logger.exception("cancellation check failed for request %s", request_id)
        return True
