"""How the wire says a request failed: one error for a tensor set that breaks the contract, and the
kind of a failure carried in the text of a request's final response."""

from __future__ import annotations

import enum
import re


class WireError(ValueError):
    """A request or response tensor set that does not follow the contract."""


class ErrorKind(enum.StrEnum):
    """Why a request failed, carried at the start of the error message of its final response.

    Triton's streaming gRPC API reports a response's error as text only (``error_message``): the
    kind travels inside it, as ``[invalid_argument] prompt too long``. Ending the stream with a
    gRPC status instead (Triton's ``triton_grpc_error`` mode) crashes tritonserver 2.51 now and
    then ("HandleCancellation called even when the context was not cancelled", then SIGSEGV).
    """

    INVALID_ARGUMENT = "invalid_argument"
    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


# Leads the text of an ``invalid_argument`` error whose cause is the request's constraint (its guide,
# or the grammar of its tools): the proxy answers it as the request field the constraint came from.
INVALID_CONSTRAINT = "invalid constraint: "
MAX_ERROR_CHARS = 500
# An absolute path of two or more parts (a model folder, a cache file): the server's business, not a client's.
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+~-]+/)+[\w.@+~-]*")


def error_message(kind: ErrorKind, message: str) -> str:
    """The wire's error text: its kind, then the message's first line (llguidance appends its parser
    state, a panic its backtrace), paths left out, at most :data:`MAX_ERROR_CHARS` characters."""
    text = _PATH.sub("<path>", message.strip().split("\n", 1)[0])
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + " [...]"
    return f"[{kind.value}] {text}"


def parse_error_message(message: str) -> tuple[ErrorKind | None, str]:
    """The kind and the text of an error message; no kind when it did not come from our backend."""
    if message.startswith("["):
        head, separator, rest = message[1:].partition("] ")
        if separator and head in ErrorKind._value2member_map_:
            return ErrorKind(head), rest
    return None, message


def constraint_refusal(text: str) -> str | None:
    """Why the constraint was refused, when :data:`INVALID_CONSTRAINT` leads ``text``; None for other errors."""
    return text.removeprefix(INVALID_CONSTRAINT) if text.startswith(INVALID_CONSTRAINT) else None
