"""Request bodies parsed into JSON values the rest of the proxy can walk without failing.

``json.loads`` accepts what later code cannot handle: nesting that exhausts Python's recursion
(in pydantic, ``json.dumps``, llguidance), integers of more than 4,300 digits, and lone
surrogates (``"\\ud800"``), which no UTF-8 encoder takes. Each is a 400 naming where it is.
"""

from __future__ import annotations

import json
from typing import Any

from llgtriton.wire import MAX_JSON_DEPTH
from proxy.errors import InvalidRequestError


def parse_body(body: bytes) -> dict[str, Any]:
    """The JSON object of ``body``; raises :class:`InvalidRequestError` for anything else."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, or an integer too long to convert
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    _check_values(data, surrogates_possible=b"\\ud" in body.lower())
    return data


def _check_values(data: dict[str, Any], *, surrogates_possible: bool) -> None:
    """Iteratively: depth at most :data:`MAX_JSON_DEPTH`, and (when the body escapes any) no lone surrogate."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            children: Any = value.items()
        elif isinstance(value, list):
            children = enumerate(value)
        else:
            if surrogates_possible and isinstance(value, str):
                _check_text(value, path)
            continue
        if len(path) >= MAX_JSON_DEPTH:
            raise InvalidRequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", param=_name(path))
        for key, child in children:
            if surrogates_possible and isinstance(key, str):
                _check_text(key, path)
            stack.append((child, (*path, key)))


def _check_text(text: str, path: tuple[str | int, ...]) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{_name(path) or 'the body'} holds a lone surrogate (U+{ord(text[exc.start]):04X}), which is not text",
            param=_name(path) or None,
        ) from None


def _name(path: tuple[str | int, ...]) -> str:
    """``messages[0].content``-style, as the validation errors name fields."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else part)
    return name
