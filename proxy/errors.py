"""The proxy's error hierarchy and the one place that maps errors to HTTP responses and SSE events.

Every error a client can see is a :class:`ProxyError` with an HTTP status and an OpenAI error
``type``; anything else that escapes a handler becomes a 500 ``internal_error``.
"""

from __future__ import annotations

import http
import json
import re
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse


class ProxyError(Exception):
    status = 500
    type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(ProxyError):
    """400: the body is not JSON, fails validation, or asks for something the backend refuses."""

    status = 400
    type = "invalid_request_error"


INVALID_CONSTRAINT = "invalid_constraint"  # the code of a 400 for a constraint (or tools) that cannot be compiled


class AuthenticationError(ProxyError):
    """401: an API key is configured and the request did not send a valid one."""

    status = 401
    type = "invalid_request_error"


class NotFoundError(ProxyError):
    """404: unknown model or route."""

    status = 404
    type = "invalid_request_error"


class MethodNotAllowedError(ProxyError):
    status = 405
    type = "invalid_request_error"


class RequestTimeoutError(ProxyError):
    """408: the client did not send its request's body within ``proxy.body_timeout_s``."""

    status = 408
    type = "invalid_request_error"


class HeadersTooLargeError(ProxyError):
    """431: the request line and headers are larger than ``proxy.max_header_bytes``."""

    status = 431
    type = "invalid_request_error"


class PayloadTooLargeError(ProxyError):
    """413: the request body is larger than ``proxy.max_body_bytes``."""

    status = 413
    type = "invalid_request_error"


class RateLimitError(ProxyError):
    """429: the proxy already serves ``proxy.max_concurrent_requests`` requests."""

    status = 429
    type = "rate_limit_exceeded"


class ServiceUnavailableError(ProxyError):
    """503: Triton is unreachable, not ready, or the backend cannot take the request now."""

    status = 503
    type = "service_unavailable"


class StoreUnavailableError(ServiceUnavailableError):
    """503: the Responses store cannot be read or written now (its file unusable, its disk full)."""


class UpstreamTimeoutError(ProxyError):
    """504: the generation did not finish within ``proxy.request_timeout_s``."""

    status = 504
    type = "timeout"


class ClientDisconnectedError(ProxyError):
    """499 (nginx's "client closed request"): nobody reads it; it marks the request in logs and metrics."""

    status = 499
    type = "client_closed_request"


class InternalError(ProxyError):
    status = 500
    type = "internal_error"


MAX_MESSAGE_CHARS = 2000  # messages echo what the client sent (an id, a model name): a huge one is cut


def error_body(error: ProxyError) -> dict[str, Any]:
    message = error.message if len(error.message) <= MAX_MESSAGE_CHARS else error.message[:MAX_MESSAGE_CHARS] + " [...]"
    return {"error": {"message": message, "type": error.type, "param": error.param, "code": error.code}}


def as_proxy_error(error: BaseException) -> ProxyError:
    if isinstance(error, ProxyError):
        return error
    return InternalError(f"internal error: {type(error).__name__}")


RETRY_AFTER_SECONDS = 1


def _headers(error: ProxyError) -> dict[str, str]:
    headers = {}
    if error.status in {429, 503}:  # come back soon
        headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def http_response(error: BaseException) -> JSONResponse:
    proxy_error = as_proxy_error(error)
    headers = _headers(proxy_error)
    return JSONResponse(error_body(proxy_error), status_code=proxy_error.status, headers=headers or None)


def raw_http_response(error: ProxyError) -> bytes:
    """The whole HTTP/1.1 response for ``error``, closing the connection: for refusals made before a
    request reaches the app (``proxy.http_protocol``)."""
    body = json.dumps(error_body(error)).encode()
    head = [f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}"]
    head += [f"{name}: {value}" for name, value in _headers(error).items()]
    head += ["content-type: application/json", f"content-length: {len(body)}", "connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


def sse_event(error: BaseException) -> bytes:
    """An error inside an open stream: one ``data:`` event with the OpenAI error object."""
    return b"data: " + json.dumps(error_body(as_proxy_error(error))).encode() + b"\n\n"


# pydantic names the union member it tried ("str", "list[str]", ...) inside an error location.
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|dict|list|none|[a-z-]+\[.*\])$")


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc if not (isinstance(part, str) and _UNION_MEMBER.match(part)))


def validation_error(error: ValidationError) -> InvalidRequestError:
    errors = error.errors()
    message = "; ".join(f"{_location(e['loc']) or 'body'}: {e['msg']}" for e in errors[:5])
    return InvalidRequestError(message, param=_location(errors[0]["loc"]) or None)
