"""Hostile requests against the real server: each is refused with a clear 400, and nothing else notices.

The cases (``bench.hostile``, which also times them) once crashed a process, answered 500 for bad
input, or broke the guarantee silently (a failed grammar answering 200, "", "stop"). After every
attack the same server must still say it is ready and answer a normal request.
"""

from __future__ import annotations

import httpx
import pytest

from bench.harness import RunningServer
from bench.hostile import (
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
