"""Helpers of the backend's tests: a sink that records a request's outputs, running requests to the end, and
the model's own greedy continuation to compare with."""

from __future__ import annotations

import threading
from typing import Any

import torch

from backend.requests import EngineRequest
from backend.scheduler import Scheduler
from llgtriton.wire import GenerationOutput


class RecordingSink:
    def __init__(self, cancel_after: int | None = None) -> None:
        self.outputs: list[GenerationOutput] = []
        self.error: Exception | None = None
        self.done = threading.Event()
        self._cancel_after = cancel_after

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        assert not self.done.is_set(), "a response after the final one"
        self.outputs.append(output)
        if final:
            self.done.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()

    def is_cancelled(self) -> bool:
        return self._cancel_after is not None and len(self.outputs) >= self._cancel_after

    def wait(self) -> None:
        assert self.done.wait(120), "the request never finished"

    @property
    def text(self) -> str:
        return "".join(o.text for o in self.outputs)


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
