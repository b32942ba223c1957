"""The benchmark's step figures: steps a second and the mean batch over a window, from running totals."""

from __future__ import annotations

import time

from backend.telemetry import StepCounters
from bench.step_rate import StepRecorder


def test_the_mean_batch_and_step_rate_cover_the_window() -> None:
    counters = StepCounters()
    recorder = StepRecorder(counters.totals, period_s=0.01)
    recorder.start()
    try:
        for _ in range(5):  # before the window: batches of 2
            counters.add_step(rows=2, constrained_rows=0, mask_seconds=0.0)
        time.sleep(0.05)
        start = time.time()
        for _ in range(40):  # the window: batches of 8, 1 ms of masks each
            counters.add_step(rows=8, constrained_rows=8, mask_seconds=0.001)
            time.sleep(0.005)
        end = time.time()
        figures = recorder.between(start, end)
    finally:
        recorder.stop()
    assert figures["mean_batch"] == 8.0
    assert figures["mask_ms_per_step"] == 1.0
    assert 40 / (end - start) * 0.8 <= figures["steps_per_s"] <= 40 / (end - start) * 1.2
