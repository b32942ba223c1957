"""The backend's error hierarchy; each error's ``code`` is the wire contract's kind of failure."""

from __future__ import annotations

from typing import ClassVar

from llgtriton.wire import ErrorKind


class BackendError(Exception):
    """Base of every error the backend reports for a request."""

    code: ClassVar[ErrorKind] = ErrorKind.INTERNAL


class InvalidRequest(BackendError):
    """The request cannot be served as sent (bad parameter, prompt too long, ...)."""

    code = ErrorKind.INVALID_ARGUMENT


class Unsupported(BackendError):
    """The request asks for a feature this build does not provide."""

    code = ErrorKind.UNSUPPORTED


class Unavailable(BackendError):
    """The backend cannot take the request now (shutting down, queue full)."""

    code = ErrorKind.UNAVAILABLE
