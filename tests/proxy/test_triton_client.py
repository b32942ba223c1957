"""The Triton stream's end: a call Triton finished is read to its end, only an open one is cancelled.

Cancelling a call that tritonserver 2.51 has already finished can crash it ("HandleCancellation
called even when the context was not cancelled", then SIGSEGV), so the client must not do it.
The stream here stands in for tritonclient's `stream_infer` iterator: `(result, error)` pairs,
`cancel()`, and the end of the call as the end of iteration.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from llgtriton import wire
from proxy import triton_client
from proxy.errors import InternalError, InvalidRequestError, ServiceUnavailableError
from proxy.triton_client import TritonGenerationClient

REQUEST = wire.GenerationRequest(prompt="hi", max_tokens=2)


def _result(output: wire.GenerationOutput, *, final: bool) -> InferResult:
    """The message Triton sends for ``output``: every tensor in ``raw_output_contents``."""
    response = service_pb2.ModelInferResponse(model_name="llm", id="r1")
    response.parameters["triton_final_response"].bool_param = final
    for name, array in wire.encode_output(output).items():
        tensor = response.outputs.add(name=name, datatype=wire.client_datatype(wire.OUTPUT_TYPES[name]))
        tensor.shape.extend(array.shape)
        raw = serialize_byte_tensor(array).item() if array.dtype == np.object_ else array.tobytes()
        response.raw_output_contents.append(raw)
    return InferResult(response)


class FakeStream:
    def __init__(self, responses: list[tuple[Any, Any]], *, ends: bool = True) -> None:
        self._responses = responses
        self._ends = ends
        self.cancelled = False
        self.ended = False

    def __aiter__(self) -> AsyncIterator[tuple[Any, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[Any, Any]]:
        while self._responses:
            yield self._responses.pop(0)
        if not self._ends:
            await asyncio.Event().wait()  # Triton never closes the call
        self.ended = True

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def _client(stream: FakeStream, monkeypatch: pytest.MonkeyPatch) -> TritonGenerationClient:
    client = TritonGenerationClient("localhost:1", "llm", timeout_s=5)
    monkeypatch.setattr(client._client, "stream_infer", lambda **_: stream)
    return client


async def _collect(stream: FakeStream, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    client = _client(stream, monkeypatch)  # its gRPC channel wants a running event loop
    return [output.text async for output in client.generate(REQUEST, "r1")]


def test_a_finished_call_is_read_to_its_end_and_not_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = FakeStream(
        [
            (_result(wire.GenerationOutput(text="a"), final=False), None),
            (_result(wire.GenerationOutput(text="b", finish_reason=wire.FinishReason.STOP), final=True), None),
        ]
    )
    assert asyncio.run(_collect(stream, monkeypatch)) == ["a", "b"]
    assert stream.ended and not stream.cancelled


def test_an_error_response_does_not_cancel_the_call_triton_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = FakeStream([(None, InferenceServerException(wire.error_message(wire.ErrorKind.INTERNAL, "boom")))])
    with pytest.raises(InternalError, match="boom"):
        asyncio.run(_collect(stream, monkeypatch))
    assert not stream.cancelled


def test_a_client_that_goes_away_mid_stream_cancels_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = FakeStream([(_result(wire.GenerationOutput(text="a"), final=False), None)], ends=False)

    async def first_then_leave() -> str:
        outputs = _client(stream, monkeypatch).generate(REQUEST, "r1")
        first = await anext(outputs)
        await outputs.aclose()
        return first.text

    assert asyncio.run(first_then_leave()) == "a"
    assert stream.cancelled


def test_a_call_left_open_after_the_final_response_is_cancelled_after_a_bounded_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(triton_client, "_DRAIN_TIMEOUT_S", 0.05)
    stream = FakeStream([(_result(wire.GenerationOutput(text="a"), final=True), None)], ends=False)
    assert asyncio.run(_collect(stream, monkeypatch)) == ["a"]
    assert stream.cancelled


OUTPUTS = [
    wire.GenerationOutput(text=""),
    wire.GenerationOutput(text="héllo, 世界 🙂", prompt_tokens=12, completion_tokens=2**31 - 1),
    wire.GenerationOutput(text='{"a": 1}', finish_reason=wire.FinishReason.STOP, prompt_tokens=3, completion_tokens=9),
    wire.GenerationOutput(text="x", finish_reason=wire.FinishReason.LENGTH, completion_tokens=1),
    wire.GenerationOutput(
        text="ab",
        completion_tokens=2,
        logprobs=(
            wire.TokenLogprob(b"a", -0.5, (wire.Alternative(b"a", -0.5), wire.Alternative(b"\xe4", -2.0))),
            wire.TokenLogprob(b"b", -1.25),
        ),
    ),
]


@pytest.mark.parametrize("output", OUTPUTS)
def test_a_response_read_from_the_raw_message_equals_the_numpy_decoding(
    output: wire.GenerationOutput, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _result(output, final=True)
    assert wire.decode_output(result.as_numpy) == output

    def no_numpy(name: str) -> None:
        raise AssertionError("decoded through numpy")

    monkeypatch.setattr(result, "as_numpy", no_numpy)
    assert triton_client.decode_response(result) == output


@pytest.mark.parametrize(
    ("message", "error_type", "text"),
    [
        (
            wire.error_message(wire.ErrorKind.INVALID_ARGUMENT, "prompt too long"),
            InvalidRequestError,
            "prompt too long",
        ),
        (wire.error_message(wire.ErrorKind.UNSUPPORTED, "no logprobs"), InvalidRequestError, "no logprobs"),
        (wire.error_message(wire.ErrorKind.UNAVAILABLE, "queue full"), ServiceUnavailableError, "queue full"),
        (wire.error_message(wire.ErrorKind.INTERNAL, "boom"), InternalError, "boom"),
        ("[not_a_kind] boom", ServiceUnavailableError, "Triton: [not_a_kind] boom; retry later"),
        ("Request for unknown model: 'llm' is not found", ServiceUnavailableError, "unknown model"),
        (
            "Failed to process the request(s) for model 'llm', message: Stub process 'llm_0_0' is not healthy.",
            ServiceUnavailableError,
            "retry later",
        ),
    ],
)
def test_an_error_in_the_stream_maps_to_the_status_its_kind_names(
    message: str, error_type: type[Exception], text: str
) -> None:
    error = triton_client._stream_error(InferenceServerException(message))
    assert type(error) is error_type
    assert text in str(error)
    assert "[invalid_argument]" not in str(error)


def test_the_backends_refusal_of_a_constraint_is_an_invalid_constraint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The field the constraint came from is the caller's to name (the backend knows only its grammar)."""
    text = wire.error_message(wire.ErrorKind.INVALID_ARGUMENT, wire.INVALID_CONSTRAINT + "Invalid type: foo")
    stream = FakeStream([(None, InferenceServerException(text))])
    with pytest.raises(InvalidRequestError) as refused:
        asyncio.run(_collect(stream, monkeypatch))
    assert (refused.value.code, refused.value.message) == ("invalid_constraint", "Invalid type: foo")
