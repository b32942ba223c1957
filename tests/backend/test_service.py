"""backend.service: requests are prepared on admission threads, so Triton's execute() returns at once."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from backend.chat_template import ChatTemplate
from backend.errors import InvalidRequest, Unavailable
from backend.requests import EngineRequest, ResponseSink
from backend.service import GenerationService
from backend.telemetry import StepCounters
from bench.harness import RecordingSink
from llgtriton.wire import GenerationRequest


class GatedTokenizer:
    """Tokenizes once ``gate`` opens: a prompt that takes long to prepare."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def encode(self, text: str) -> list[int]:
        assert self.gate.wait(30)
        return [1] * len(text.split())

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "bb": 1}


class RecordingRunner:
    def __init__(self) -> None:
        self.counters = StepCounters()
        self.submitted: list[EngineRequest] = []
        self.arrived = threading.Event()

    def load(self) -> tuple[int, int]:
        return 0, len(self.submitted)

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None:
        self.submitted.append(request)
        self.arrived.set()

    def shutdown(self) -> None:
        pass


def service(tokenizer: GatedTokenizer, runner: RecordingRunner, max_admitting: int = 256) -> GenerationService:
    return GenerationService(
        tokenizer, cast(ChatTemplate, None), runner, vocab_size=2, max_model_len=64, max_admitting=max_admitting
    )


def test_submit_returns_before_the_request_is_prepared() -> None:
    tokenizer, runner = GatedTokenizer(), RecordingRunner()
    running = service(tokenizer, runner)
    try:
        running.submit(GenerationRequest(prompt="one two three", max_tokens=4), "r", RecordingSink())
        assert runner.submitted == []  # still tokenizing, and execute() would be free again
        tokenizer.gate.set()
        assert runner.arrived.wait(30)
        assert runner.submitted[0].prompt_ids == (1, 1, 1)
    finally:
        tokenizer.gate.set()
        running.shutdown()


def test_a_request_refused_while_being_prepared_fails_its_sink() -> None:
    tokenizer, runner = GatedTokenizer(), RecordingRunner()
    tokenizer.gate.set()
    running = service(tokenizer, runner)
    sink = RecordingSink()
    try:
        running.submit(GenerationRequest(prompt="one two", max_tokens=1000), "r", sink)
        sink.wait()
    finally:
        running.shutdown()
    assert isinstance(sink.error, InvalidRequest) and "context" in str(sink.error)
    assert runner.submitted == []


def test_admission_is_bounded() -> None:
    tokenizer, runner = GatedTokenizer(), RecordingRunner()
    running = service(tokenizer, runner, max_admitting=2)
    try:
        for index in range(2):
            running.submit(GenerationRequest(prompt="x", max_tokens=1), f"r{index}", RecordingSink())
        with pytest.raises(Unavailable):
            running.submit(GenerationRequest(prompt="x", max_tokens=1), "r2", RecordingSink())
    finally:
        tokenizer.gate.set()
        running.shutdown()
    assert len(runner.submitted) == 2


@pytest.mark.parametrize(
    ("ids", "expected"),
    [((1, 0, 1), None), ((1, 2), "holds token 2; the vocabulary has 2")],
)
def test_a_prompt_of_token_ids_skips_the_tokenizer(ids: tuple[int, ...], expected: str | None) -> None:
    tokenizer, runner = GatedTokenizer(), RecordingRunner()  # the gate stays shut: tokenizing would hang
    running = service(tokenizer, runner)
    sink = RecordingSink()
    try:
        running.submit(GenerationRequest(prompt_token_ids=ids, max_tokens=4), "r", sink)
        if expected is None:
            assert runner.arrived.wait(30)
            assert runner.submitted[0].prompt_ids == ids
        else:
            sink.wait()
            assert isinstance(sink.error, InvalidRequest) and expected in str(sink.error)
    finally:
        tokenizer.gate.set()
        running.shutdown()
