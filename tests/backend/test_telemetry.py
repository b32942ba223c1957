"""Step totals reach the metrics as deltas, published away from the step loop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from backend.telemetry import MetricsPublisher, StepCounters


@dataclass
class _Value:
    increments: list[float] = field(default_factory=list)
    value: float = 0.0

    def increment(self, value: float) -> None:
        self.increments.append(value)
        self.value += value

    def set(self, value: float) -> None:
        self.value = value


class _Factory:
    def __init__(self) -> None:
        self.metrics: dict[str, _Value] = {}

    def counter(self, name: str, description: str) -> _Value:
        return self.metrics.setdefault(name, _Value())

    def gauge(self, name: str, description: str) -> _Value:
        return self.metrics.setdefault(name, _Value())


def test_publisher_adds_only_what_happened_since_the_last_publish() -> None:
    factory, counters = _Factory(), StepCounters()
    load = (3, 5)
    publisher = MetricsPublisher(factory, counters, lambda: load)
    counters.add_step(rows=4, constrained_rows=1, mask_seconds=0.25)
    counters.add_step(rows=2, constrained_rows=1, mask_seconds=0.5)
    publisher.publish()
    metric = {name.removeprefix("llgtriton_backend_"): value for name, value in factory.metrics.items()}
    assert metric["steps_total"].value == 2
    assert metric["rows_total"].value == 6
    assert metric["constrained_rows_total"].value == 2
    assert metric["mask_seconds_total"].value == 0.75
    assert metric["batch_size"].value == 3
    assert metric["constrained_fraction"].value == 2 / 6
    assert (metric["running_requests"].value, metric["queue_depth"].value) == (3, 5)

    load = (0, 0)
    counters.add_step(rows=1, constrained_rows=0, mask_seconds=0.0)
    publisher.publish()
    assert metric["steps_total"].increments == [2, 1]
    assert metric["rows_total"].value == 7
    assert metric["constrained_fraction"].value == 0
    assert metric["queue_depth"].value == 0

    publisher.publish()  # an idle interval: no increments, gauges say so
    assert metric["steps_total"].increments == [2, 1]
    assert metric["batch_size"].value == 0


def test_publisher_thread_publishes_until_stopped() -> None:
    factory, counters = _Factory(), StepCounters()
    publisher = MetricsPublisher(factory, counters, lambda: (0, 0), interval_s=0.01)
    counters.add_step(rows=1, constrained_rows=1, mask_seconds=0.0)
    publisher.start()
    try:
        for _ in range(500):
            if factory.metrics["llgtriton_backend_steps_total"].value == 1:
                break
            time.sleep(0.01)
    finally:
        publisher.stop()
    assert factory.metrics["llgtriton_backend_steps_total"].value == 1
