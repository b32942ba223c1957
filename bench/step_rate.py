"""How the engine's step loop ran over a measurement window: steps a second and the mean batch.

A layer that loses tokens/s to the engine alone does so in one of two ways: its engine steps as
fast but with fewer requests in the batch (the layers deliver finished requests and admit new ones
too late, so a closed loop of clients keeps the batch short), or its steps themselves are slower
(the engine's process does more per step). ``rows / steps`` (the mean batch) and ``steps / s`` tell
the two apart.

The engine layer's totals are read from its in-process service. Triton's come from its metrics
endpoint (``llgtriton_backend_steps_total`` and ``..._rows_total``), which the backend publishes
once a second; the window is widened by that interval at the end, so the figures are approximate
by up to a second of steps at each edge.
"""

from __future__ import annotations

import bisect
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from backend.telemetry import PUBLISH_INTERVAL_S, StepTotals

_COUNTERS = {
    "llgtriton_backend_steps_total": "steps",
    "llgtriton_backend_rows_total": "rows",
    "llgtriton_backend_mask_seconds_total": "mask_seconds",
}


def triton_totals(metrics_url: str) -> Callable[[], StepTotals]:
    """A reader of the backend's step totals from Triton's metrics endpoint."""

    def read() -> StepTotals:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in _COUNTERS:
                values[_COUNTERS[name]] = values.get(_COUNTERS[name], 0.0) + float(line.rsplit(" ", 1)[1])
        return StepTotals(
            steps=int(values.get("steps", 0)),
            rows=int(values.get("rows", 0)),
            mask_seconds=values.get("mask_seconds", 0.0),
        )

    return read


@dataclass(frozen=True)
class _Sample:
    wall: float
    totals: StepTotals


class StepRecorder:
    """Samples of step totals every ``period_s`` in a thread, from ``start()`` to ``stop()``."""

    def __init__(self, read: Callable[[], StepTotals], *, lag_s: float = 0.0, period_s: float = 0.25) -> None:
        self._read = read
        self._lag_s = lag_s
        self._period_s = period_s
        self._samples: list[_Sample] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="step-recorder", daemon=True)

    @classmethod
    def of_triton(cls, metrics_port: int) -> StepRecorder:
        return cls(triton_totals(f"http://127.0.0.1:{metrics_port}/metrics"), lag_s=PUBLISH_INTERVAL_S)

    def start(self) -> None:
        self._take()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _take(self) -> None:
        taken = _Sample(time.time(), self._read())
        with self._lock:
            self._samples.append(taken)

    def _sample(self) -> None:
        while not self._stopping.wait(self._period_s):
            try:
                self._take()
            except OSError:  # the server is going away: the samples so far stand
                return

    def between(self, start: float, end: float) -> dict[str, float]:
        """Steps a second, mean batch and mask time per step from ``start`` to ``end`` (time.time())."""
        if self._lag_s:
            time.sleep(max(0.0, end + self._lag_s + self._period_s - time.time()))
        self._take()
        with self._lock:
            samples = list(self._samples)
        walls = [sample.wall for sample in samples]
        first = max(0, min(bisect.bisect_right(walls, start) - 1, len(samples) - 2))
        last = max(bisect.bisect_left(walls, end + self._lag_s), first + 1)
        last = min(last, len(samples) - 1)
        before, after = samples[first].totals, samples[last].totals
        steps, rows = after.steps - before.steps, after.rows - before.rows
        return {
            "steps_per_s": round(steps / max(end - start, 1e-9), 1),
            "mean_batch": round(rows / steps, 1) if steps else 0.0,
            "mask_ms_per_step": round((after.mask_seconds - before.mask_seconds) / steps * 1e3, 3) if steps else 0.0,
        }
