"""The proxy's only way to generate: one Triton gRPC stream per request, on one shared channel."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import grpc
import tritonclient.grpc.aio as triton_grpc
from tritonclient.utils import InferenceServerException

from llgtriton import wire
from proxy.errors import (
    INVALID_CONSTRAINT,
    InternalError,
    InvalidRequestError,
    ProxyError,
    ServiceUnavailableError,
    UpstreamTimeoutError,
)

logger = logging.getLogger(__name__)

# How long to wait for Triton to end a call after its final response before cancelling it.
_DRAIN_TIMEOUT_S = 1.0
_HEALTH_TIMEOUT_S = 5.0  # a readiness probe's own timeout is typically 1-10 s

_STATUS_ERRORS: dict[grpc.StatusCode, type[ProxyError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.UNIMPLEMENTED: InvalidRequestError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequestError,
    grpc.StatusCode.UNAVAILABLE: ServiceUnavailableError,
    grpc.StatusCode.NOT_FOUND: ServiceUnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ServiceUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UpstreamTimeoutError,
}


class GenerationClient(Protocol):
    def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]: ...

    async def is_ready(self) -> bool: ...

    async def close(self) -> None: ...


def _rpc_error(error: grpc.aio.AioRpcError) -> ProxyError:
    error_type = _STATUS_ERRORS.get(error.code(), InternalError)
    details = error.details() or error.code().name
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        # Either Triton itself (connection refused, restarting) or the backend refusing work (full queue).
        details = f"unavailable, retry later: {details}"
    return error_type(details)


_KIND_ERRORS: dict[wire.ErrorKind, Callable[[str], ProxyError]] = {
    wire.ErrorKind.INVALID_ARGUMENT: InvalidRequestError,
    wire.ErrorKind.UNSUPPORTED: InvalidRequestError,
    wire.ErrorKind.UNAVAILABLE: lambda text: ServiceUnavailableError(f"unavailable, retry later: {text}"),
    wire.ErrorKind.INTERNAL: InternalError,
}


def _stream_error(error: InferenceServerException) -> ProxyError:
    """An error response in the stream. Our backend's carries its kind (see wire.ErrorKind); one
    without a kind comes from tritonserver itself (the model loading, its stub dead and being
    restarted, the model unknown), which the proxy's well-formed requests meet only while the
    server cannot serve them: unavailable, worth a retry here or on another replica."""
    message = error.message() if isinstance(error, InferenceServerException) else str(error)
    kind, text = wire.parse_error_message(message or "")
    refused = wire.constraint_refusal(text) if kind is wire.ErrorKind.INVALID_ARGUMENT else None
    if refused is not None:  # the request's grammar: the caller names the field it came from
        return InvalidRequestError(refused, code=INVALID_CONSTRAINT)
    if kind is not None:
        return _KIND_ERRORS[kind](text)
    return ServiceUnavailableError(f"Triton: {message}; retry later")


_INT32 = struct.Struct("<i")
_LENGTH = struct.Struct("<I")


def _bytes_elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements from Triton's raw encoding: a 4-byte little-endian length, then the bytes."""
    elements, offset = [], 0
    while offset < len(raw):
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        elements.append(raw[offset : offset + length])
        offset += length
    return elements


def decode_response(result: Any) -> wire.GenerationOutput:
    """One streamed response, read from the gRPC message's raw contents (no numpy per chunk).

    Triton sends every output in ``raw_output_contents``; anything else (typed ``contents``, a
    type the wire contract does not use) goes through tritonclient's own decoding.
    """
    response = result.get_response()
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        return wire.decode_output(result.as_numpy)
    values: dict[str, Sequence[object]] = {}
    for output, contents in zip(response.outputs, raw, strict=True):
        if output.datatype == "BYTES":
            values[output.name] = _bytes_elements(contents)
        elif output.datatype == "INT32":
            values[output.name] = [value for (value,) in _INT32.iter_unpack(contents)]
        else:
            return wire.decode_output(result.as_numpy)
    return wire.decode_output_values(values.get)


def _inputs(request: wire.GenerationRequest) -> list[Any]:
    return _tensors(wire.encode_request(request))


def _tensors(arrays: dict[str, Any]) -> list[Any]:
    inputs = []
    for name, array in arrays.items():
        tensor = triton_grpc.InferInput(name, list(array.shape), wire.client_datatype(wire.INPUT_TYPES[name]))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


async def _drain(stream: Any) -> bool:
    """After a final or error response Triton ends the call (we sent our one request); read that end."""
    try:
        async with asyncio.timeout(_DRAIN_TIMEOUT_S):
            async for _ in stream:
                logger.warning("Triton sent a response after the final one; ignored")
    except TimeoutError:
        logger.warning("Triton kept a finished stream open for %.1f s; cancelling it", _DRAIN_TIMEOUT_S)
        return False
    except (grpc.aio.AioRpcError, InferenceServerException):
        return True  # ended, with a status we no longer need
    return True


class TritonGenerationClient:
    def __init__(self, url: str, model_name: str, timeout_s: float, key: str | None = None) -> None:
        self._client = triton_grpc.InferenceServerClient(url)
        self._model_name = model_name
        self._timeout_s = timeout_s
        # Triton's inference API may require a key (triton.inference_key), sent as gRPC metadata.
        self._headers = {wire.GRPC_KEY_PREFIX + wire.INFERENCE_KEY_HEADER: key} if key is not None else None

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        try:
            inputs = _inputs(request)
        except wire.WireError as exc:
            raise InvalidRequestError(str(exc)) from None
        async for output in self._stream(inputs, request_id):
            yield output

    async def _stream(self, inputs: list[Any], request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self._model_name, "inputs": inputs, "request_id": request_id}

        stream = self._client.stream_infer(
            inputs_iterator=requests(), stream_timeout=self._timeout_s, headers=self._headers
        )
        call_ended = False
        try:
            async for result, error in stream:
                if error is not None:
                    call_ended = await _drain(stream)
                    raise _stream_error(error)
                yield decode_response(result)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    call_ended = await _drain(stream)
                    return
            call_ended = True
            raise InternalError("Triton closed the stream before the final response")
        except grpc.aio.AioRpcError as exc:
            call_ended = True
            raise _rpc_error(exc) from None
        except InferenceServerException as exc:
            raise ServiceUnavailableError(f"Triton: {exc.message()}") from None
        finally:
            # Cancel only a call that is still open (the client went away mid-stream). Cancelling one
            # that Triton has already finished races its stream teardown: tritonserver 2.51 logs
            # "HandleCancellation called even when the context was not cancelled" and can crash.
            if not call_ended:
                stream.cancel()

    async def is_ready(self) -> bool:
        """Triton has the model, and the model's engine says it can take requests (not restarting, not stuck)."""
        try:
            if not await self._client.is_model_ready(self._model_name):
                return False
            async with asyncio.timeout(_HEALTH_TIMEOUT_S):
                async for _ in self._stream(_tensors(wire.encode_health_check()), "health-check"):
                    pass
        except (InferenceServerException, grpc.aio.AioRpcError, ProxyError, TimeoutError) as exc:
            logger.debug("not ready: %s", exc)
            return False
        return True

    async def close(self) -> None:
        await self._client.close()
