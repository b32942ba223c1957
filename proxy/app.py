"""The Starlette application: routes, body parsing, and the error handlers.

Handlers parse and validate, call :class:`~proxy.serving.Generations`, and frame the result as
JSON or server-sent events; every error goes through ``proxy.errors``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llgtriton.settings import ProxySettings
from proxy.api_keys import accepted_keys
from proxy.body import parse_body
from proxy.disconnects import cancelled_on_disconnect
from proxy.errors import (
    ClientDisconnectedError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    ProxyError,
    RequestTimeoutError,
    http_response,
    validation_error,
)
from proxy.guards import ApiKeyGuard, ConcurrencyGuard, GenerationSlots, InFlightCount, LocalInFlight
from proxy.metrics import MeteredClient, ProxyMetrics, RequestMetrics
from proxy.openapi import openapi_document
from proxy.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, now
from proxy.replicas import ReplicaPool
from proxy.responses.protocol import ResponsesRequest
from proxy.responses.service import Responses
from proxy.responses.store import owner_of
from proxy.responses.store_location import open_response_store
from proxy.serving import Generations
from proxy.sse import EventStreamResponse
from proxy.triton_client import GenerationClient, TritonGenerationClient

logger = logging.getLogger(__name__)

RequestModel = TypeVar("RequestModel", bound=BaseModel)


def _json(model: BaseModel, status_code: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the request body is {declared} bytes; the limit is {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():
                body.extend(part)
                if len(body) > limit:
                    raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
    except TimeoutError:  # also a Content-Length larger than what is sent, which would wait forever
        raise RequestTimeoutError(f"the request body did not arrive within {timeout_s:g} s") from None
    except ClientDisconnect:  # gone before its body arrived: nothing to answer, nothing went wrong
        raise ClientDisconnectedError("the client disconnected while sending its request") from None
    return bytes(body)


_PARSED_ON_THE_LOOP_BYTES = 64 << 10


def _validated(body: bytes, model: type[RequestModel]) -> RequestModel:
    try:
        return model.model_validate(parse_body(body))
    except ValidationError as exc:
        raise validation_error(exc) from None


class Handlers:
    def __init__(
        self, settings: ProxySettings, generations: Generations, responses: Responses, client: GenerationClient
    ) -> None:
        self._settings = settings
        self._generations = generations
        self._responses = responses
        self._client = client
        self._model_card = ModelCard(id=generations.model_name, created=now())
        self._scoped = bool(accepted_keys(settings))  # stored responses belong to the key that made them

    async def _parse(self, request: Request, model: type[RequestModel]) -> RequestModel:
        body = await _read_body(request, self._settings.max_body_bytes, self._settings.body_timeout_s)
        # A large body takes a while to parse and check: a thread's work, so /health and the streams go on.
        parsed = (
            _validated(body, model)
            if len(body) < _PARSED_ON_THE_LOOP_BYTES
            else await asyncio.to_thread(_validated, body, model)
        )
        requested = getattr(parsed, "model", None)
        if requested != self._model_card.id:
            raise NotFoundError(
                f"the model {requested!r} does not exist; this server serves {self._model_card.id!r}",
                param="model",
                code="model_not_found",
            )
        return parsed

    async def models(self, request: Request) -> Response:
        return _json(ModelList(data=[self._model_card]))

    async def model(self, request: Request) -> Response:
        if request.path_params["model"] != self._model_card.id:
            raise NotFoundError(f"the model {request.path_params['model']!r} does not exist", code="model_not_found")
        return _json(self._model_card)

    async def chat_completions(self, request: Request) -> Response:
        body = await self._parse(request, ChatCompletionRequest)
        if body.stream:
            return EventStreamResponse(self._generations.chat_stream(body))
        async with cancelled_on_disconnect(request.receive):
            return _json(await self._generations.chat(body))

    async def completions(self, request: Request) -> Response:
        body = await self._parse(request, CompletionRequest)
        if body.stream:
            return EventStreamResponse(self._generations.completion_stream(body))
        async with cancelled_on_disconnect(request.receive):
            return _json(await self._generations.completion(body))

    def _owner(self, request: Request) -> str:
        """Whose stored responses a request may see: its API key's (the guard has checked the key)."""
        if not self._scoped:
            return ""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return owner_of(token.strip() if scheme.lower() == "bearer" else None)

    async def create_response(self, request: Request) -> Response:
        body = await self._parse(request, ResponsesRequest)
        owner = self._owner(request)
        if body.stream:
            return EventStreamResponse(self._responses.stream(body, owner), named=True)
        async with cancelled_on_disconnect(request.receive):
            return _json(await self._responses.create(body, owner))

    async def stored_response(self, request: Request) -> Response:
        response_id, owner = request.path_params["response_id"], self._owner(request)
        if request.method == "DELETE":
            return _json(await self._responses.delete(response_id, owner))
        starting_after = request.query_params.get("starting_after")
        if request.query_params.get("stream") in ("true", "1"):
            if starting_after is not None and not starting_after.isdigit():
                raise InvalidRequestError("starting_after must be a sequence number", param="starting_after")
            after = None if starting_after is None else int(starting_after)
            return EventStreamResponse(self._responses.resume(response_id, owner, after), named=True, may_be_empty=True)
        if starting_after is not None:
            raise InvalidRequestError("starting_after needs stream=true", param="starting_after")
        return _json(await self._responses.get(response_id, owner))

    async def cancel_response(self, request: Request) -> Response:
        return _json(await self._responses.cancel(request.path_params["response_id"], self._owner(request)))

    async def response_input_items(self, request: Request) -> Response:
        query = request.query_params
        limit = query.get("limit", "20")
        if not limit.isdigit():
            raise InvalidRequestError("limit must be an integer", param="limit")
        listed = await self._responses.input_items(
            request.path_params["response_id"],
            self._owner(request),
            limit=int(limit),
            order=query.get("order", "desc"),
            after=query.get("after"),
        )
        return _json(listed)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(self._model_card.id))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        if await self._client.is_ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)


async def _proxy_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ProxyError) and exc.status >= 500:
        logger.warning("%s %s failed: %s", request.method, request.url.path, exc)
    return http_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return http_response(NotFoundError(f"no route {request.method} {request.url.path}"))
    if exc.status_code == 405:
        response = http_response(MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}"))
        response.headers.update(exc.headers or {})  # Starlette's Allow: the methods the route has
        return response
    return JSONResponse({"error": {"message": exc.detail, "type": "invalid_request_error"}}, exc.status_code)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.exception("%s %s failed", request.method, request.url.path)
    return http_response(exc)


def triton_client(settings: ProxySettings, metrics: ProxyMetrics, triton_key: str | None = None) -> GenerationClient:
    """One Triton gRPC client, or a pool of them when several replicas are configured."""
    clients = [
        (url, TritonGenerationClient(url, settings.model_name, settings.request_timeout_s, triton_key))
        for url in settings.triton_urls
    ]
    if len(clients) == 1:
        return clients[0][1]
    return ReplicaPool(clients, metrics)


@dataclass(frozen=True)
class SharedState:
    """What one of several proxy processes shares with the others (``proxy.workers``)."""

    in_flight: InFlightCount
    metrics_dir: Path


def create_app(
    settings: ProxySettings,
    client: GenerationClient | None = None,
    shared: SharedState | None = None,
    triton_key: str | None = None,
) -> Starlette:
    """The proxy app; ``client`` defaults to a Triton gRPC client built from ``settings``, which sends
    ``triton_key`` when Triton's inference API requires one.

    ``shared``: this process is one of several on the same port, and the concurrency limit and
    the metrics count across all of them.
    """
    metrics = ProxyMetrics(None if shared is None else shared.metrics_dir)
    generation_client = MeteredClient(client or triton_client(settings, metrics, triton_key), metrics)
    model_name = settings.served_model_name or settings.model_name
    in_flight = LocalInFlight() if shared is None else shared.in_flight
    generations = Generations(
        generation_client, model_name, GenerationSlots(settings.max_concurrent_requests, in_flight)
    )
    store = settings.responses_store
    keys = accepted_keys(settings)
    responses = Responses(
        generations,
        lambda: open_response_store(
            store, ttl_s=settings.responses_ttl_s, max_bytes=settings.responses_max_bytes, owners=len(keys) or 1
        ),
        stale_after_s=settings.responses_stale_after_s,
    )
    handlers = Handlers(settings, generations, responses, generation_client)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await responses.close()
        await generation_client.close()

    routes = [
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/models/{model:path}", handlers.model, methods=["GET"]),
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/responses", handlers.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", handlers.stored_response, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/input_items", handlers.response_input_items, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", handlers.cancel_response, methods=["POST"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/ready", handlers.ready, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
        Route("/openapi.json", handlers.openapi, methods=["GET"]),
    ]
    exception_handlers: dict[Any, Any] = {
        ProxyError: _proxy_error,
        HTTPException: _http_error,
        Exception: _unexpected_error,
    }
    # Outermost first: every request is counted, refused ones included; keys before the limit.
    middleware = [Middleware(RequestMetrics, metrics=metrics)]
    if keys:
        middleware.append(Middleware(ApiKeyGuard, keys=keys))
    if settings.max_concurrent_requests is not None:
        middleware.append(Middleware(ConcurrencyGuard, limit=settings.max_concurrent_requests, in_flight=in_flight))
    return Starlette(routes=routes, exception_handlers=exception_handlers, lifespan=lifespan, middleware=middleware)
