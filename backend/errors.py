"""The backend's error hierarchy; ``model.py`` maps ``code`` to a Triton error code."""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error the backend reports for a request."""

    code = "internal"


class InvalidRequest(BackendError):
    """The request cannot be served as sent (bad parameter, prompt too long, ...)."""

    code = "invalid_argument"


class Unsupported(BackendError):
    """The request asks for a feature this build does not provide."""

    code = "unsupported"


class Unavailable(BackendError):
    """The backend cannot take the request now (shutting down, queue full)."""

    code = "unavailable"
