"""Logprobs on the wire: a token's bytes and log probability with its alternatives, and the compact
JSON that carries them in a response's ``token_logprobs`` and ``prompt_logprobs`` tensors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llgtriton.wire_errors import WireError


@dataclass(frozen=True)
class Alternative:
    token: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's bytes and log probability, with the most likely alternatives."""

    token: bytes
    logprob: float
    top: tuple[Alternative, ...] = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's tokens, each scored given the tokens before it; nothing scores the first."""

    first: bytes
    rest: tuple[TokenLogprob, ...]


def _entries(entries: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [
        {
            "token": list(e.token),
            "logprob": e.logprob,
            "top": [{"token": list(a.token), "logprob": a.logprob} for a in e.top],
        }
        for e in entries
    ]


def logprobs_json(entries: tuple[TokenLogprob, ...] | None) -> str:
    return "" if entries is None else json.dumps(_entries(entries), separators=(",", ":"))


def prompt_logprobs_json(prompt: PromptLogprobs | None) -> str:
    if prompt is None:
        return ""
    return json.dumps({"first": list(prompt.first), "rest": _entries(prompt.rest)}, separators=(",", ":"))


def _entries_from(items: Any) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(
            bytes(e["token"]),
            float(e["logprob"]),
            tuple(Alternative(bytes(a["token"]), float(a["logprob"])) for a in e["top"]),
        )
        for e in items
    )


def logprobs_from_json(payload: str, name: str) -> tuple[TokenLogprob, ...] | None:
    if not payload:
        return None
    try:
        return _entries_from(json.loads(payload))
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"{name!r} is malformed: {exc}") from None


def prompt_logprobs_from_json(payload: str, name: str) -> PromptLogprobs | None:
    if not payload:
        return None
    try:
        document = json.loads(payload)
        return PromptLogprobs(bytes(document["first"]), _entries_from(document["rest"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"{name!r} is malformed: {exc}") from None
