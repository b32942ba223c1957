"""The proxy's OpenAPI document, built from the same pydantic models that validate requests.

Request schemas come from the request models in validation mode, so the document accepts what
the proxy accepts (unknown fields included: they are ignored, as OpenAI's clients expect);
response schemas come from the response models. Served at ``/openapi.json``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from proxy.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
    request_models,
)
from proxy.responses.output import ResponseEvent
from proxy.responses.protocol import DeletedResponse, InputItemList, Response, ResponsesRequest

_MODELS: list[type[BaseModel]] = [
    ChatCompletionRequest,
    CompletionRequest,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ModelCard,
    ModelList,
    ResponsesRequest,
    Response,
    ResponseEvent,
    DeletedResponse,
    InputItemList,
]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

# Status codes every generation request may get, besides its 200.
_GENERATION_ERRORS = {
    "400": "Invalid request: a field fails validation, an unsupported parameter, a constraint that does not compile",
    "401": "Missing or wrong API key (when keys are configured)",
    "404": "Unknown model, or no such stored response",
    "413": "Body larger than the proxy's limit",
    "429": "Too many concurrent requests (when a limit is configured); see Retry-After",
    "503": "Triton or the model is not available, or the backend queue is full; see Retry-After",
}


# Fields the request models parse but the proxy serves only with these values (anything else is a
# 400 `unsupported_parameter`, see proxy/translate.py); the document states what is accepted.
_ACCEPTED_ONLY: dict[str, dict[str, dict[str, Any]]] = {
    "ChatCompletionRequest": {},
    "ResponsesRequest": {
        "truncation": {"enum": ["disabled", None]},
        "conversation": {"type": "null"},
        "prompt": {"type": "null"},
        "max_tool_calls": {"type": "null"},
        "include": {"anyOf": [{"type": "array", "items": {"const": "message.output_text.logprobs"}}, {"type": "null"}]},
    },
    "CompletionRequest": {
        "suffix": {"enum": ["", None]},
        "best_of": {"enum": [1, None]},
    },
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: str) -> dict[str, Any]:
    return {code: _json({"$ref": "#/components/schemas/Error"}, _GENERATION_ERRORS[code]) for code in codes}


def _event(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event of a stream: JSON of a chunk (or an error object), or the last ``[DONE]``."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "description": f"A {chunk.__name__} or an error object as JSON; the last event is [DONE]",
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [_ref(chunk), {"$ref": "#/components/schemas/Error"}]},
                    },
                ],
            }
        },
    }


def _named_event() -> dict[str, Any]:
    """One server-sent event of a Responses stream: ``event: <type>`` and its JSON; no ``[DONE]``."""
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string"},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref(ResponseEvent)},
        },
    }


def _generation(summary: str, request: type[BaseModel], response: type[BaseModel], chunk: type[BaseModel]) -> Any:
    named = chunk is ResponseEvent
    stream = (
        "`event: <type>` and `data: <event JSON>` per event, from `response.created` to `response.completed`"
        if named
        else f"each `data: <{chunk.__name__} JSON>`, then `data: [DONE]`"
    )
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": f"A {response.__name__} object, or with `stream: true` server-sent events, {stream}",
                    "content": {
                        "application/json": {"schema": _ref(response)},
                        "text/event-stream": {"schema": _named_event() if named else _event(chunk)},
                    },
                },
                **_errors("400", "401", "404", "413", "429", "503"),
            },
        }
    }


def _null_takes_the_default(components: dict[str, Any]) -> None:
    """Request fields that have a default also accept null, which means the default (``RequestBody``)."""
    for model in request_models():
        properties = components.get(model.__name__, {}).get("properties", {})
        for name, field in model.model_fields.items():
            key = field.alias or name
            if key in properties and not field.is_required() and field.default is not None:
                schema = properties[key]
                kept = {k: schema.pop(k) for k in ("default", "description", "title") if k in schema}
                properties[key] = {"anyOf": [schema, {"type": "null"}], **kept}


def _stored_responses() -> dict[str, Any]:
    """The routes of stored responses: read, delete, cancel (background ones), list the input items."""
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}

    def route(summary: str, model: type[BaseModel], *codes: str, query: Sequence[Any] = ()) -> dict[str, Any]:
        return {
            "summary": summary,
            "parameters": [response_id, *query],
            "responses": {"200": _json(_ref(model), summary), **_errors("401", "404", *codes)},
        }

    listing = [
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
        {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
        {"name": "after", "in": "query", "schema": {"type": "string"}},
    ]
    replaying = [
        {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
        {"name": "starting_after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
    ]
    return {
        "/v1/responses/{response_id}": {
            "get": route(
                "A stored response; with `stream=true`, its events after `starting_after` (a streamed background"
                " response's as they come)",
                Response,
                "400",
                query=replaying,
            ),
            "delete": route("Delete a stored response", DeletedResponse),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": route("The input items of a stored response", InputItemList, "400", query=listing)
        },
        "/v1/responses/{response_id}/cancel": {"post": route("Cancel a background response", Response, "400")},
    }


@functools.cache
def openapi_document(served_model: str) -> dict[str, Any]:
    """The document for a proxy serving ``served_model`` (the one value ``model`` may take)."""
    _, schemas = models_json_schema(
        [(model, "validation" if model.__name__.endswith("Request") else "serialization") for model in _MODELS],
        ref_template="#/components/schemas/{model}",
    )
    components = {**schemas.get("$defs", {}), "Error": _ERROR}
    _null_takes_the_default(components)
    for request in (ChatCompletionRequest, CompletionRequest, ResponsesRequest):
        properties = components[request.__name__]["properties"]
        properties["model"] = {"type": "string", "enum": [served_model]}
        for name, accepted in _ACCEPTED_ONLY[request.__name__].items():
            properties[name] = {**accepted, "description": "Other values are refused (400 unsupported_parameter)"}
    status = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
    health = {"get": {"summary": "Liveness: the proxy answers", "responses": {"200": _json(status, "Alive")}}}
    ready = {
        "get": {
            "summary": "Readiness: Triton is reachable and the model is loaded",
            "responses": {"200": _json(status, "Ready"), "503": _json(status, "Not ready")},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llgtriton",
            "version": "1",
            "description": "OpenAI-compatible API with structured output guaranteed by llguidance.",
        },
        "paths": {
            "/v1/chat/completions": _generation(
                "Chat completion", ChatCompletionRequest, ChatCompletion, ChatCompletionChunk
            ),
            "/v1/completions": _generation("Text completion", CompletionRequest, Completion, Completion),
            "/v1/responses": _generation(
                "Create a response (Responses API)", ResponsesRequest, Response, ResponseEvent
            ),
            **_stored_responses(),
            "/v1/models": {
                "get": {
                    "summary": "The served model",
                    "responses": {"200": _json(_ref(ModelList), "The model list"), **_errors("401")},
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "enum": [served_model]},
                        }
                    ],
                    "responses": {"200": _json(_ref(ModelCard), "The model"), **_errors("401", "404")},
                }
            },
            "/health": health,
            "/ready": ready,
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics of the proxy",
                    "responses": {
                        "200": {
                            "description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {"schemas": components},
    }
