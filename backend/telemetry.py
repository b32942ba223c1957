"""What the step loop did, counted cheaply on its thread and published elsewhere, off the step path.

The scheduler adds each step's rows, constrained rows and mask time to :class:`StepCounters`
(a lock and four additions). A :class:`MetricsPublisher` thread turns the totals into metrics
once per interval through a :class:`MetricFactory`: the Triton adapter supplies one backed by
Triton's custom metrics API, whose every update is a message to the server process, which is
why nothing is published per step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0


class Counter(Protocol):
    def increment(self, value: float) -> None: ...


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class MetricFactory(Protocol):
    def counter(self, name: str, description: str) -> Counter: ...

    def gauge(self, name: str, description: str) -> Gauge: ...


@dataclass(frozen=True)
class StepTotals:
    steps: int = 0
    rows: int = 0  # logits rows: one per running request per step (prefill or decode)
    constrained_rows: int = 0
    mask_seconds: float = 0.0  # host time in the logits post-processor (wait for masks, apply them)

    def __add__(self, other: StepTotals) -> StepTotals:
        return StepTotals(
            self.steps + other.steps,
            self.rows + other.rows,
            self.constrained_rows + other.constrained_rows,
            self.mask_seconds + other.mask_seconds,
        )


class StepCounters:
    """Running totals of the step loop; any thread may read a consistent snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = StepTotals()

    def add_step(self, rows: int, constrained_rows: int, mask_seconds: float) -> None:
        with self._lock:
            totals = self._totals
            self._totals = StepTotals(
                steps=totals.steps + 1,
                rows=totals.rows + rows,
                constrained_rows=totals.constrained_rows + constrained_rows,
                mask_seconds=totals.mask_seconds + mask_seconds,
            )

    def totals(self) -> StepTotals:
        with self._lock:
            return self._totals

    def set_totals(self, totals: StepTotals) -> None:
        """Take another process's totals (the engine's, when it runs in a process of its own)."""
        with self._lock:
            self._totals = totals


class MetricsPublisher:
    """Publishes the step totals and the queue as metrics named ``llgtriton_backend_*``."""

    def __init__(
        self,
        factory: MetricFactory,
        counters: StepCounters,
        load: Callable[[], tuple[int, int]],
        interval_s: float = PUBLISH_INTERVAL_S,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self._counters = counters
        self._load = load
        self._active = active
        self._interval_s = interval_s
        self._published = StepTotals()
        self._steps = factory.counter("llgtriton_backend_steps_total", "Steps of the batch loop")
        self._rows = factory.counter(
            "llgtriton_backend_rows_total", "Logits rows over all steps (rows / steps = mean batch size)"
        )
        self._constrained_rows = factory.counter(
            "llgtriton_backend_constrained_rows_total", "Logits rows masked by a constraint"
        )
        self._mask_seconds = factory.counter(
            "llgtriton_backend_mask_seconds_total", "Seconds the step loop spent computing and applying token masks"
        )
        self._queue_depth = factory.gauge(
            "llgtriton_backend_queue_depth", "Requests waiting for a batch slot, including those compiling a grammar"
        )
        self._running = factory.gauge("llgtriton_backend_running_requests", "Requests in the running batch")
        self._batch_size = factory.gauge(
            "llgtriton_backend_batch_size", "Mean logits rows per step over the last publishing interval"
        )
        self._constrained_fraction = factory.gauge(
            "llgtriton_backend_constrained_fraction", "Constrained share of the rows over the last publishing interval"
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llgtriton-metrics", daemon=True)

    def publish(self) -> None:
        now, last = self._counters.totals(), self._published
        if not self._active():  # another instance publishes this engine's figures
            self._published = now
            return
        steps, rows = now.steps - last.steps, now.rows - last.rows
        constrained = now.constrained_rows - last.constrained_rows
        if steps:
            self._steps.increment(steps)
            self._rows.increment(rows)
            self._constrained_rows.increment(constrained)
            self._mask_seconds.increment(now.mask_seconds - last.mask_seconds)
        self._batch_size.set(rows / steps if steps else 0.0)
        self._constrained_fraction.set(constrained / rows if rows else 0.0)
        running, waiting = self._load()
        self._running.set(running)
        self._queue_depth.set(waiting)
        self._published = now

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(self._interval_s * 2)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.publish()
            except Exception:  # metrics must never take the model down
                logger.exception("publishing backend metrics failed")
