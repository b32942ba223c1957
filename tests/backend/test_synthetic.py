"""The synthetic engine: no model, exact token counts, streaming, cancellation."""

from __future__ import annotations

import pytest

from backend.errors import InvalidRequest
from backend.synthetic import WORD, SyntheticService
from llgtriton.settings import EngineSettings
from llgtriton.wire import FinishReason, GenerationRequest
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
