"""Helpers of the backend's tests: running requests to the end (the recording sink is ``tests.support.harness``'s),
and the model's own greedy continuation to compare with."""

from __future__ import annotations

from typing import Any

import torch

from backend.requests import EngineRequest
from backend.scheduler import Scheduler
from tests.support.harness import RecordingSink


def run(scheduler: Scheduler, *requests: EngineRequest) -> list[RecordingSink]:
    sinks = [RecordingSink() for _ in requests]
    for item, sink in zip(requests, sinks, strict=True):
        scheduler.submit(item, sink)
    for sink in sinks:
        sink.wait()
    return sinks


def greedy_alone(model: Any, prompt: list[int], steps: int) -> list[int]:
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(steps):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
    return out
