"""Hostile requests, as an attacker would send them: through the proxy and straight at Triton.

Each case once crashed a process (llguidance's native recursion overflowing the stack), answered
500 for bad input, or broke the guarantee silently. ``tests/e2e/test_hostile.py`` asserts that each
is refused with a 400 (``[invalid_argument]`` from Triton) and that the server then still serves;
``bench.hostile`` times each refusal, and ``bench.soak`` mixes them into its load.
"""

from __future__ import annotations

import contextlib
import json
import queue
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "SmolLM2-135M-Instruct"
NORMAL = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}


def ref_chain(depth: int) -> dict[str, Any]:
    """A schema whose $refs chain ``depth`` deep (an array of an array of ...)."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(depth)}
    return {"$defs": {**defs, f"d{depth}": {"type": "integer"}}, "$ref": "#/$defs/d0"}


def bare_ref_chain(depth: int) -> dict[str, Any]:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(depth)}
    return {"$defs": {**defs, f"d{depth}": {"type": "integer"}}, "$ref": "#/$defs/d0"}


LARK_CHAIN = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(3000)) + 'r3000: "b"\n'
LARK_WIDE = "start: " + " | ".join(f'"w{i}"' for i in range(2500))


def nested(depth: int) -> str:
    """JSON text of a string inside ``depth`` arrays (too deep for json.dumps to write)."""
    return "[" * depth + '"x"' + "]" * depth


@dataclass(frozen=True)
class ProxyAttack:
    name: str
    path: str  # under /v1
    body: bytes


@dataclass(frozen=True)
class TritonAttack:
    name: str
    inputs: dict[str, bytes | list[bytes]]  # BYTES tensors; text_input "Hi" and max_tokens 4 unless given


def _chat(**fields: Any) -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}
    ).encode()


def _completion(**fields: Any) -> bytes:
    return json.dumps({**NORMAL, **fields}).encode()


def _tool(description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "description": description, "parameters": {"type": "object"}}}


def _raw(template: str, value: str) -> bytes:
    """A body whose ``value`` is JSON text that json.dumps would not write (too deep, a lone surrogate)."""
    return template.replace("MODEL", MODEL).replace("VALUE", value).encode()


PROXY_ATTACKS = [
    ProxyAttack(
        "response_format, $refs chained 1,500 deep",
        "/chat/completions",
        _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": ref_chain(1500)}}),
    ),
    ProxyAttack(
        "guided_json, bare $refs chained 2,500 deep", "/chat/completions", _chat(guided_json=bare_ref_chain(2500))
    ),
    ProxyAttack(
        "structured_outputs.grammar, 3,000 chained rules",
        "/chat/completions",
        _chat(structured_outputs={"grammar": LARK_CHAIN}),
    ),
    ProxyAttack("guided_grammar, 3,000 chained rules", "/completions", _completion(guided_grammar=LARK_CHAIN)),
    ProxyAttack(
        "tool parameters, $refs chained 1,500 deep",
        "/chat/completions",
        _chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": ref_chain(1500)}}],
            tool_choice="required",
        ),
    ),
    ProxyAttack("regex d{300000} (lexer out of expressions)", "/completions", _completion(guided_regex="d{300000}")),
    ProxyAttack("regex a{1000000}", "/completions", _completion(guided_regex="a{1000000}")),
    ProxyAttack("Lark alternation of 2,500 strings", "/completions", _completion(guided_grammar=LARK_WIDE)),
    ProxyAttack(
        "body nested 1,000 deep",
        "/chat/completions",
        _raw(
            '{"model": "MODEL", "messages": [{"role": "user", "content": "Hi"}], "metadata": {"x": VALUE}}',
            nested(1000),
        ),
    ),
    ProxyAttack(
        "body nested 200 deep",
        "/chat/completions",
        _raw(
            '{"model": "MODEL", "messages": [{"role": "user", "content": "Hi"}], "metadata": {"x": VALUE}}', nested(200)
        ),
    ),
    ProxyAttack(
        "integer of 5,000 digits",
        "/completions",
        _raw('{"model": "MODEL", "prompt": "Hi", "max_tokens": VALUE}', "1" + "0" * 5000),
    ),
    ProxyAttack(
        "lone surrogate in a prompt", "/completions", _raw('{"model": "MODEL", "prompt": "VALUE"}', "a\\ud800b")
    ),
    ProxyAttack(
        "lone surrogate in stop",
        "/completions",
        _raw('{"model": "MODEL", "prompt": "a", "stop": ["VALUE"]}', "\\udc00"),
    ),
    ProxyAttack(
        "lone surrogate in a regex",
        "/completions",
        _raw('{"model": "MODEL", "prompt": "a", "guided_regex": "VALUE"}', "\\ud800"),
    ),
    ProxyAttack(
        "lone surrogate in a JSON schema",
        "/chat/completions",
        _raw(
            '{"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "guided_json": {"enum": ["VALUE"]}}',
            "\\ud800",
        ),
    ),
    ProxyAttack("prompt of 4 MB", "/completions", _completion(prompt="word " * (800 * 1024))),
    ProxyAttack("tool description of 3.8 MB", "/chat/completions", _chat(tools=[_tool("x" * 3_800_000)])),
    ProxyAttack(
        "120,000 empty messages",
        "/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": ""}] * 120_000}).encode(),
    ),
    ProxyAttack(
        "guided_choice of 100,000 entries",
        "/completions",
        _completion(guided_choice=[f"o{i}" * 2 for i in range(100_000)]),
    ),
    ProxyAttack(
        "ignore_eos with n 8 and no max_tokens",
        "/chat/completions",
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 8, "ignore_eos": True}
        ).encode(),
    ),
    ProxyAttack(
        "chat_template_kwargs return_tensors", "/chat/completions", _chat(chat_template_kwargs={"return_tensors": "np"})
    ),
    ProxyAttack(
        "chat_template_kwargs truncation to 2 tokens",
        "/chat/completions",
        _chat(chat_template_kwargs={"truncation": True, "max_length": 2}),
    ),
]

TRITON_ATTACKS = [
    TritonAttack(
        "guide: $refs chained 1,500 deep",
        {"guided_decoding_guide_type": b"json_schema", "guided_decoding_guide": json.dumps(ref_chain(1500)).encode()},
    ),
    TritonAttack(
        "guide: regex d{300000}", {"guided_decoding_guide_type": b"regex", "guided_decoding_guide": b"d{300000}"}
    ),
    TritonAttack(
        "guide: 3,000 chained rules",
        {"guided_decoding_guide_type": b"lark", "guided_decoding_guide": LARK_CHAIN.encode()},
    ),
    TritonAttack("chat_messages nested 5,000 deep", {"chat_messages": nested(5000).encode()}),
    TritonAttack("text_input not UTF-8 (an encoded surrogate)", {"text_input": b"a\xed\xa0\x80b"}),
    TritonAttack("1,000 stop_words", {"stop_words": [f"s{i}".encode() for i in range(1000)]}),
    TritonAttack("logit_bias key of non-ASCII digits", {"logit_bias": '{"²": 1}'.encode()}),
    TritonAttack(
        "chat_template_kwargs return_tensors",
        {
            "chat_messages": json.dumps([{"role": "user", "content": "Hi"}]).encode(),
            "chat_template_kwargs": b'{"return_tensors": "np"}',
        },
    ),
]


def proxy_attack(base_url: str, attack: ProxyAttack) -> httpx.Response:
    return httpx.post(
        base_url + attack.path, content=attack.body, headers={"Content-Type": "application/json"}, timeout=120
    )


def triton_attack(grpc_url: str, attack: TritonAttack) -> str | None:
    """The error message the stream ended with, or None if it answered."""
    inputs = {"text_input": b"Hi", **attack.inputs} if "chat_messages" not in attack.inputs else dict(attack.inputs)
    tensors = [_bytes_tensor(name, value) for name, value in inputs.items()]
    max_tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    max_tokens.set_data_from_numpy(np.array([[4]], dtype=np.int32))
    client = grpcclient.InferenceServerClient(grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        # A stream refused as it opens (a restricted API) raises here; the callback has the reason.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer(
                "llm", [*tensors, max_tokens], request_id="hostile", enable_empty_final_response=True
            )
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return str(error.message())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        client.stop_stream()
        client.close()


def _bytes_tensor(name: str, value: bytes | list[bytes]) -> grpcclient.InferInput:
    values = value if isinstance(value, list) else [value]
    tensor = grpcclient.InferInput(name, [1, len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array([values], dtype=np.object_))
    return tensor


def normal_request_seconds(base_url: str) -> float:
    """Seconds a normal completion takes; raises unless it succeeds and the server says it is ready."""
    httpx.get(base_url.removesuffix("/v1") + "/ready", timeout=10).raise_for_status()
    started = time.perf_counter()
    reply = httpx.post(base_url + "/completions", json=NORMAL, timeout=60)
    reply.raise_for_status()
    return time.perf_counter() - started
