"""Hostile and random bodies against the proxy: always a well-formed 2xx or 4xx answer, never a 500.

Bodies start from a valid chat or completion request and have fields replaced by random JSON
(any type, any size), random unknown fields added, and random JSON schemas as constraints, so
the request models, the translation and the constraint compiler (llguidance, in the proxy's
compile check) all see input nobody wrote by hand.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.proxy.scripted import MODEL, ScriptedClient, http_client, scripted_app

SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats() | st.text(max_size=20)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
CHAT_FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "stream",
    "stream_options", "seed", "presence_penalty", "frequency_penalty", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "logprobs", "top_logprobs", "logit_bias", "user", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar",
]  # fmt: skip
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "stream", "echo", "suffix", "best_of", "stop"]
SCHEMA_KEYWORDS = ["type", "properties", "items", "enum", "const", "required", "minimum", "pattern", "anyOf", "$ref"]
SCHEMAS = st.recursive(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object", "array")]),
    lambda inner: (
        st.dictionaries(st.sampled_from(SCHEMA_KEYWORDS), inner | JSON, max_size=3)
        | st.builds(lambda props: {"type": "object", "properties": props}, st.dictionaries(st.text(max_size=5), inner))
    ),
    max_leaves=6,
)


def _mutated(base: dict[str, Any], fields: list[str]) -> Any:
    replacements = st.dictionaries(st.sampled_from(fields), JSON, max_size=3)
    unknown = st.dictionaries(st.text(max_size=10).filter(lambda k: k not in fields), JSON, max_size=2)
    return st.builds(lambda r, u: {**base, **u, **r}, replacements, unknown)


CHAT_BODIES = _mutated({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, CHAT_FIELDS)
COMPLETION_BODIES = _mutated({"model": MODEL, "prompt": "Once"}, COMPLETION_FIELDS)
CONSTRAINED = st.builds(
    lambda schema, stream: {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    },
    SCHEMAS,
    st.booleans(),
)


def _post_all(path: str, bodies: list[Any]) -> list[tuple[int, Any]]:
    async def run() -> list[tuple[int, Any]]:
        async with http_client(scripted_app(ScriptedClient()), raise_app_exceptions=False) as http:
            answers = []
            for body in bodies:
                content = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
                response = await http.post(path, content=content, headers={"content-type": "application/json"})
                answers.append((response.status_code, response))
            return answers

    return asyncio.run(run())


def _assert_well_formed(status: int, response: Any) -> None:
    assert status in {200, 400, 404, 413}, (status, response.text)
    if status != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(CHAT_BODIES, min_size=1, max_size=3))
def test_random_chat_bodies_never_cause_a_500(bodies: list[Any]) -> None:
    for status, response in _post_all("/v1/chat/completions", bodies):
        _assert_well_formed(status, response)


@FUZZ
@given(st.lists(COMPLETION_BODIES, min_size=1, max_size=3))
def test_random_completion_bodies_never_cause_a_500(bodies: list[Any]) -> None:
    for status, response in _post_all("/v1/completions", bodies):
        _assert_well_formed(status, response)


@FUZZ
@given(CONSTRAINED)
def test_random_schemas_compile_or_are_refused_with_a_400(body: dict[str, Any]) -> None:
    ((status, response),) = _post_all("/v1/chat/completions", [body])
    _assert_well_formed(status, response)
    if status == 400:
        assert response.json()["error"]["code"] in {"invalid_constraint", None}


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200) | JSON.map(lambda value: json.dumps(value).encode()))
def test_random_bytes_and_non_object_json_are_a_400(body: bytes) -> None:
    ((status, response),) = _post_all("/v1/chat/completions", [body])
    assert status in {400, 404}, (status, response.text)  # 404: an object naming another model
