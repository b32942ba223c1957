"""backend.service: requests are prepared on admission threads, so Triton's execute() returns at once."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from backend.chat_template import ChatTemplate
from backend.contract import ResponseSink
from backend.errors import InvalidRequest, Unavailable
from backend.requests import EngineRequest
from backend.service import GenerationService
from backend.telemetry import StepCounters
from llgtriton.messages import ChatMessage
from llgtriton.tools import Function, ToolMode, ToolRequest
from llgtriton.wire import GenerationRequest
from tests.support.harness import RecordingSink


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


def refusal(request: GenerationRequest) -> str:
    """Why the service refuses ``request`` (its chat template is None: rendering would fail otherwise)."""
    tokenizer, runner = GatedTokenizer(), RecordingRunner()
    tokenizer.gate.set()
    running = service(tokenizer, runner)
    sink = RecordingSink()
    try:
        running.submit(request, "r", sink)
        sink.wait()
    finally:
        running.shutdown()
    assert isinstance(sink.error, InvalidRequest) and runner.submitted == []
    return str(sink.error)


def test_tools_that_cannot_fit_the_context_are_refused_before_rendering() -> None:
    """The tools count toward the prompt: a long description is refused by its size, not rendered."""
    described = Function("f", "x" * 200, {"type": "object"})
    request = GenerationRequest(messages=(ChatMessage("user", "hi"),), tools=ToolRequest((described,), ToolMode.AUTO))
    assert "bytes, more than a context of 64 tokens can hold" in refusal(request)


def test_more_messages_than_the_context_holds_are_refused_before_rendering() -> None:
    request = GenerationRequest(messages=tuple(ChatMessage("user", "") for _ in range(65)), max_tokens=1)
    assert "65 messages are more than a context of 64 tokens can hold" in refusal(request)


def test_a_prompt_as_long_as_the_context_can_still_be_scored() -> None:
    tokenizer, runner = GatedTokenizer(), RecordingRunner()
    running = service(tokenizer, runner)
    try:
        scored = GenerationRequest(prompt_token_ids=(1,) * 64, max_tokens=0, prompt_logprobs=True)
        running.submit(scored, "r", RecordingSink())
        assert runner.arrived.wait(30) and runner.submitted[0].max_tokens == 0
    finally:
        running.shutdown()
    assert "the context is 64 tokens" in refusal(GenerationRequest(prompt_token_ids=(1,) * 64, max_tokens=1))


@pytest.mark.parametrize("name", ["return_tensors", "truncation"])
def test_chat_template_kwargs_that_are_rendering_parameters_are_refused(name: str) -> None:
    request = GenerationRequest(messages=(ChatMessage("user", "hi"),), chat_template_kwargs={name: 1})
    assert repr(name) in refusal(request)
