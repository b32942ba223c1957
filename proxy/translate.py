"""OpenAI request bodies to the wire's :class:`GenerationRequest`; refuses what cannot be honoured."""

from __future__ import annotations

import logging

from llgtriton import wire
from proxy.errors import InvalidRequestError
from proxy.protocol import ChatCompletionRequest, CompletionRequest, _GenerationRequest

logger = logging.getLogger(__name__)


def _refuse(feature: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{feature} is not supported by this server yet; the request was refused rather than served without it",
        param=param,
        code="unsupported_parameter",
    )


def _log_unknown_fields(request: _GenerationRequest) -> None:
    if request.model_extra:
        logger.info("ignoring unknown request fields: %s", ", ".join(sorted(request.model_extra)))


def _common(request: _GenerationRequest) -> dict[str, object]:
    _log_unknown_fields(request)
    if request.n != 1:
        raise _refuse("n > 1", "n")
    return {
        "stream": request.stream,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": max(request.top_k, 0),
        "seed": request.seed,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "stop": request.stop_strings(),
    }


def chat_generation(request: ChatCompletionRequest) -> wire.GenerationRequest:
    if request.response_format is not None and request.response_format.type != "text":
        raise _refuse(f"response_format {request.response_format.type!r}", "response_format")
    if request.tools:
        raise _refuse("tools", "tools")
    if request.logprobs:
        raise _refuse("logprobs", "logprobs")
    messages = tuple(wire.ChatMessage(role=m.role, content=m.text()) for m in request.messages)
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    return wire.GenerationRequest(messages=messages, max_tokens=max_tokens, **_common(request))  # type: ignore[arg-type]


def completion_generation(request: CompletionRequest) -> wire.GenerationRequest:
    if request.echo:
        raise _refuse("echo", "echo")
    if request.logprobs is not None:
        raise _refuse("logprobs", "logprobs")
    if request.suffix:
        raise _refuse("suffix", "suffix")
    if request.best_of not in (None, 1):
        raise _refuse("best_of", "best_of")
    return wire.GenerationRequest(
        prompt=request.prompt_text(),
        max_tokens=request.max_tokens,
        **_common(request),  # type: ignore[arg-type]
    )
