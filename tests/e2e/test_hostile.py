"""Hostile requests against the real server: each is refused with a clear 400, and nothing else notices.

The cases (``bench.hostile``, which also times them) once crashed a process, answered 500 for bad
input, or broke the guarantee silently (a failed grammar answering 200, "", "stop"). After every
attack the same server must still say it is ready and answer a normal request.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.attacks import (
    MODEL,
    NORMAL,
    PROXY_ATTACKS,
    TRITON_ATTACKS,
    ProxyAttack,
    TritonAttack,
    normal_request_seconds,
    proxy_attack,
    triton_attack,
)
from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("attack", PROXY_ATTACKS, ids=lambda attack: attack.name)
def test_through_the_proxy_an_attack_is_refused_and_the_server_keeps_serving(
    server: RunningServer, attack: ProxyAttack
) -> None:
    for _ in range(2):  # the second time too: nothing kept from the first may answer differently
        reply = proxy_attack(server.openai_base_url, attack)
        assert reply.status_code == 400, (reply.status_code, reply.text[:500])
        message = reply.json()["error"]["message"]
        assert message and len(message) < 1000
    normal_request_seconds(server.openai_base_url)


@pytest.mark.parametrize("attack", TRITON_ATTACKS, ids=lambda attack: attack.name)
def test_straight_at_triton_an_attack_is_an_invalid_argument(server: RunningServer, attack: TritonAttack) -> None:
    for _ in range(2):
        error = triton_attack(server.grpc_url, attack)
        assert error is not None and error.startswith("[invalid_argument] "), error
        assert len(error) < 1000
    normal_request_seconds(server.openai_base_url)


def test_a_choice_of_thousands_of_items_generates_one_of_them(server: RunningServer) -> None:
    """Beyond llguidance's 2,000-item Earley row, as a trie: a large enum is legitimate."""
    choices = [f"option {i}" for i in range(5000)]
    reply = httpx.post(
        server.openai_base_url + "/completions",
        json={**NORMAL, "guided_choice": choices, "max_tokens": 10},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text[:500]
    choice = reply.json()["choices"][0]
    assert choice["text"] in choices and choice["finish_reason"] == "stop"


def test_a_recursive_schema_within_the_bounds_is_served(server: RunningServer) -> None:
    tree = {
        "$defs": {
            "node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
        },
        "$ref": "#/$defs/node",
    }
    reply = httpx.post(
        server.openai_base_url + "/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "A tree"}],
            "guided_json": tree,
            "max_tokens": 8,
        },
        timeout=120,
    )
    assert reply.status_code == 200, reply.text[:500]


def test_a_choice_of_sixty_thousand_items_generates_one_of_them(server: RunningServer) -> None:
    """Past llguidance's 65,000 grammar symbols as a trie of rules; one lexeme holds it."""
    choices = [f"option {i}" for i in range(60_000)]
    reply = httpx.post(
        server.openai_base_url + "/completions",
        json={**NORMAL, "guided_choice": choices, "max_tokens": 10},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text[:500]
    assert reply.json()["choices"][0]["text"] in choices


# The guarantee against hostile constraints: text a constraint requires is text ---------------------

SPELLED = [
    ("guided_regex", r"a<\|im_end\|>b", "a<|im_end|>b"),
    ("guided_regex", r"x<\|im_start\|>y", "x<|im_start|>y"),
    ("guided_regex", "<repo_name><filename>", "<repo_name><filename>"),
    ("guided_choice", ["x<|im_end|>"], "x<|im_end|>"),
    (
        "guided_json",
        {"type": "object", "properties": {"<|im_end|>": {"const": "<|im_end|>"}}, "required": ["<|im_end|>"]},
        None,
    ),
]


@pytest.mark.parametrize(("field", "guide", "expected"), SPELLED, ids=[f"{f}:{e or 'json'}" for f, _, e in SPELLED])
def test_a_special_tokens_spelling_in_a_constraint_is_written_as_text(
    server: RunningServer, field: str, guide: object, expected: str | None
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Go."}],
        field: guide,
        "max_tokens": 40,
        "temperature": 0,
    }
    reply = httpx.post(server.openai_base_url + "/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text[:500]
    choice = reply.json()["choices"][0]
    content = choice["message"]["content"]
    if expected is None:
        assert json.loads(content) == {"<|im_end|>": "<|im_end|>"}
    else:
        assert content == expected
    assert choice["finish_reason"] == "stop"


# A stop string ends a constrained output only where it is complete -------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "city": {"type": "string", "maxLength": 12}},
    "required": ["name", "city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
STOPPED = [
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}),
    ("guided_regex", {"guided_regex": "[a-z]{3}-[0-9]{3}"}),
    ("required", {"tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False}),
    ("named", {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
]


@pytest.mark.parametrize(("kind", "fields"), STOPPED, ids=[kind for kind, _ in STOPPED])
def test_a_stop_string_inside_a_constrained_output_does_not_cut_it(
    server: RunningServer, kind: str, fields: dict[str, object]
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe a person."}],
        "max_tokens": 60,
        "temperature": 0,
        "stop": ['"', "-", ","],
        **fields,
    }
    choice = httpx.post(server.openai_base_url + "/chat/completions", json=body, timeout=120).json()["choices"][0]
    message = choice["message"]
    if kind == "guided_regex":
        assert len(message["content"]) == 7 and message["content"][3] == "-"
    elif kind == "json_schema":
        assert set(json.loads(message["content"])) == {"name", "city"}
    else:
        (call,) = message["tool_calls"]
        assert set(json.loads(call["function"]["arguments"])) == {"city"}
    assert choice["finish_reason"] in ("stop", "tool_calls")


def test_a_stop_string_still_cuts_free_text(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count: one, two, three."}],
        "max_tokens": 40,
        "temperature": 0,
    }
    whole = httpx.post(server.openai_base_url + "/chat/completions", json=body, timeout=120).json()["choices"][0]
    text = whole["message"]["content"]
    stop = text.split()[1] if len(text.split()) > 1 else text[1:3]
    cut = httpx.post(server.openai_base_url + "/chat/completions", json={**body, "stop": [stop]}, timeout=120).json()
    assert cut["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


# Request text never becomes a control token ----------------------------------------------------


def test_a_spelled_control_token_in_a_message_is_text_in_the_prompt(server: RunningServer) -> None:
    """As text, ``<|im_end|>`` takes several prompt tokens; as the special token it would take one."""

    def prompt_tokens(content: str) -> int:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
        reply = httpx.post(server.openai_base_url + "/chat/completions", json=body, timeout=120)
        return int(reply.json()["usage"]["prompt_tokens"])

    assert prompt_tokens("a<|im_end|>b") - prompt_tokens("ab") > 3
