"""The synthetic engine: no model, exact token counts, streaming, cancellation, steps over every running request."""

from __future__ import annotations

import threading

import pytest

from backend.errors import InvalidRequest, Unavailable
from backend.synthetic import WORD, SyntheticService
from llgtriton.settings import EngineSettings
from llgtriton.wire import FinishReason, GenerationOutput, GenerationRequest
from tests.support.harness import RecordingSink


@pytest.fixture
def service() -> SyntheticService:
    return SyntheticService(EngineSettings(engine="synthetic"))


def test_streams_max_tokens_chunks_then_finishes_by_length(service: SyntheticService) -> None:
    sink = RecordingSink()
    service.submit(GenerationRequest(prompt="one two three", max_tokens=3, stream=True), "s", sink)
    sink.wait()
    assert [o.text for o in sink.outputs] == [WORD] * 3
    assert [o.completion_tokens for o in sink.outputs] == [1, 2, 3]
    assert sink.outputs[-1].finish_reason is FinishReason.LENGTH
    assert sink.outputs[-1].prompt_tokens == 3
    service.shutdown()


def test_whole_response_when_not_streaming(service: SyntheticService) -> None:
    sink = RecordingSink()
    service.submit(GenerationRequest(prompt="x", max_tokens=4), "w", sink)
    sink.wait()
    assert [o.text for o in sink.outputs] == [WORD * 4]
    service.shutdown()


def test_cancellation_ends_the_stream(service: SyntheticService) -> None:
    sink = RecordingSink(cancel_after=2)
    service.submit(GenerationRequest(prompt="x", max_tokens=100, stream=True), "c", sink)
    sink.wait()
    assert len(sink.outputs) == 3  # two tokens, then the final response of a cancelled request
    assert sink.outputs[-1].finish_reason is None
    service.shutdown()


def test_bad_max_tokens_is_refused(service: SyntheticService) -> None:
    with pytest.raises(InvalidRequest):
        service.submit(GenerationRequest(prompt="x", max_tokens=0), "bad", RecordingSink())
    service.shutdown()


def test_a_long_request_does_not_hold_back_a_later_short_one(service: SyntheticService) -> None:
    long_outputs_when_short_ended: list[int] = []

    def on_long_output(output: GenerationOutput) -> None:
        if output.completion_tokens == 1:
            service.submit(GenerationRequest(prompt="x", max_tokens=3, stream=True), "short", short)

    def on_short_output(output: GenerationOutput) -> None:
        if output.finish_reason is not None:
            long_outputs_when_short_ended.append(len(long.outputs))

    long = RecordingSink(cancel_after=20_000, on_output=on_long_output)
    short = RecordingSink(on_output=on_short_output)
    service.submit(GenerationRequest(prompt="x", max_tokens=100_000, stream=True), "long", long)
    short.wait()
    # a step gives each running request a token: the short one ends within four steps of the long one's
    assert long_outputs_when_short_ended and long_outputs_when_short_ended[0] <= 5
    assert [o.completion_tokens for o in short.outputs] == [1, 2, 3]
    long.wait()
    service.shutdown()


def test_requests_past_the_batch_size_wait_for_a_free_slot() -> None:
    service = SyntheticService(EngineSettings(engine="synthetic", max_batch_size=1))
    second = RecordingSink()
    loads: list[tuple[int, int]] = []

    def on_first_output(output: GenerationOutput) -> None:
        if output.completion_tokens == 1:
            service.submit(GenerationRequest(prompt="x", max_tokens=2, stream=True), "second", second)
            loads.append(service.load())

    first = RecordingSink(on_output=on_first_output)
    service.submit(GenerationRequest(prompt="x", max_tokens=5, stream=True), "first", first)
    second.wait()
    assert loads == [(1, 1)]  # one running, one waiting
    assert first.stamps[-1][0] <= second.stamps[0][0]  # the second began after the first ended
    assert [o.completion_tokens for o in second.outputs] == [1, 2]
    service.shutdown()


def test_shutting_down_ends_the_running_requests_with_an_error(service: SyntheticService) -> None:
    started = threading.Event()
    sink = RecordingSink(on_output=lambda output: started.set())
    service.submit(GenerationRequest(prompt="x", max_tokens=10**9, stream=True), "endless", sink)
    assert started.wait(10)
    service.shutdown()
    sink.wait()
    assert isinstance(sink.error, Unavailable)


def test_a_step_takes_at_least_the_step_time_asked_for() -> None:
    service = SyntheticService(EngineSettings(engine="synthetic", synthetic_step_ms=20))
    sink = RecordingSink()
    service.submit(GenerationRequest(prompt="x", max_tokens=5, stream=True), "paced", sink)
    sink.wait()
    assert [tokens for _, tokens in sink.stamps] == [1, 2, 3, 4, 5]  # a response per token: the sink keeps up
    assert sink.stamps[-1][0] - sink.stamps[0][0] >= 4 * 0.020
    service.shutdown()
