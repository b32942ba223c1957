"""The backend's error hierarchy; each error's ``code`` is the wire contract's kind of failure.

:func:`error_kind` is the one mapping from an error the backend meets to the kind the wire carries
(``model.py`` writes it into the response, the engine core sends it up its pipe), and
:func:`error_of_kind` the way back, for the stub that reads a core's failure.
"""

from __future__ import annotations

from typing import ClassVar

from llgtriton.wire import INVALID_CONSTRAINT, ErrorKind, WireError


class BackendError(Exception):
    """Base of every error the backend reports for a request."""

    code: ClassVar[ErrorKind] = ErrorKind.INTERNAL


class InvalidRequest(BackendError):
    """The request cannot be served as sent (bad parameter, prompt too long, ...)."""

    code = ErrorKind.INVALID_ARGUMENT


class InvalidConstraint(InvalidRequest):
    """The request's constraint (its guide, or its tools' grammar) cannot be compiled. Its text says
    so first (``INVALID_CONSTRAINT``), for the proxy to name the field the constraint came from."""

    def __init__(self, reason: str) -> None:
        super().__init__(INVALID_CONSTRAINT + reason)


class Unsupported(BackendError):
    """The request asks for a feature this build does not provide."""

    code = ErrorKind.UNSUPPORTED


class Unavailable(BackendError):
    """The backend cannot take the request now (shutting down, queue full)."""

    code = ErrorKind.UNAVAILABLE


_BY_KIND: dict[ErrorKind, type[BackendError]] = {
    kind_error.code: kind_error for kind_error in (InvalidRequest, Unsupported, Unavailable)
}


def error_kind(error: Exception) -> ErrorKind:
    """A backend error's own kind; a request that breaks the wire contract is invalid; anything else
    is internal."""
    if isinstance(error, BackendError):
        return error.code
    if isinstance(error, WireError):
        return ErrorKind.INVALID_ARGUMENT
    return ErrorKind.INTERNAL


def error_of_kind(kind: ErrorKind, message: str) -> BackendError:
    return _BY_KIND.get(kind, BackendError)(message)
