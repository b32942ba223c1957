"""One mapping from the errors the backend meets to the wire's kinds, and back in the stub."""

from __future__ import annotations

import pytest

from backend.errors import BackendError, InvalidRequest, Unavailable, Unsupported, error_kind, error_of_kind
from llgtriton.wire import ErrorKind, WireError


@pytest.mark.parametrize("error_type", [InvalidRequest, Unsupported, Unavailable])
def test_a_backend_error_crosses_a_pipe_as_its_kind_and_comes_back_the_same(error_type: type[BackendError]) -> None:
    kind = error_kind(error_type("no"))
    back = error_of_kind(kind, "no")
    assert type(back) is error_type
    assert str(back) == "no"


def test_a_request_that_breaks_the_wire_contract_is_invalid() -> None:
    assert error_kind(WireError("'max_tokens' must hold one value")) is ErrorKind.INVALID_ARGUMENT


def test_anything_else_is_internal() -> None:
    assert error_kind(RuntimeError("a bug")) is ErrorKind.INTERNAL
    assert type(error_of_kind(ErrorKind.INTERNAL, "a bug")) is BackendError
