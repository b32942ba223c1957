"""Reasoning models through the proxy: the thinking the backend sends apart is reasoning_content, never content."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from llgtriton import wire
from llgtriton.reasoning import REASONING_FORMATS, ReasoningSplitter, Split
from tests.proxy.scripted import ScriptedClient, chat_body, sse_events

CHAT = "/v1/chat/completions"

QWEN3, R1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]


def outputs(*texts: str, form: str = "qwen3") -> list[wire.GenerationOutput]:
    """What the backend sends for an output written in ``texts``, one response each: its thinking
    apart from its answer (``OutputStream`` splits them with the same splitter)."""
    splitter = ReasoningSplitter(REASONING_FORMATS[form]) if form else None
    scripted = []
    for index, text in enumerate(texts):
        split = splitter.feed(text) if splitter is not None else Split(content=text)
        if index < len(texts) - 1:
            scripted.append(wire.GenerationOutput(split.content, reasoning=split.reasoning))
            continue
        rest = splitter.finish() if splitter is not None else Split()
        scripted.append(
            wire.GenerationOutput(
                split.content + rest.content,
                wire.FinishReason.STOP,
                prompt_tokens=3,
                completion_tokens=9,
                reasoning=split.reasoning + rest.reasoning,
            )
        )
    scripted[0] = dataclasses.replace(scripted[0], reasoning_format=form)
    return scripted


@pytest.mark.parametrize("size", [1, 5, 100])
async def test_the_thinking_streams_as_reasoning_content_and_the_answer_as_content(
    http: httpx.AsyncClient, client: ScriptedClient, size: int
) -> None:
    text = '<think>The user wants JSON.</think>\n\n{"n": 4}'
    client.script(outputs(*[text[i : i + size] for i in range(0, len(text), size)]))
    whole = (await http.post(CHAT, json=chat_body())).json()["choices"][0]
    assert whole["message"] == {"role": "assistant", "content": '{"n": 4}', "reasoning_content": "The user wants JSON."}
    client.script(outputs(*[text[i : i + size] for i in range(0, len(text), size)]))
    events = sse_events(await http.post(CHAT, json=chat_body(stream=True)))
    deltas = [event["choices"][0]["delta"] for event in events if event["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "The user wants JSON."
    assert "".join(d.get("content") or "" for d in deltas) == '{"n": 4}'
    assert all("think>" not in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)


async def test_calls_after_the_thinking_are_tool_calls(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    client.script(outputs('<think>Call f.</think>[{"name": "f", "arguments": {}}]'))
    choice = (await http.post(CHAT, json=chat_body(tools=tools, tool_choice="required"))).json()["choices"][0]
    assert choice["message"]["reasoning_content"] == "Call f."
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["f"]
    assert choice["finish_reason"] == "tool_calls"


async def test_chat_template_kwargs_reach_the_backend(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(outputs("Four.", form=""))
    body = chat_body(chat_template_kwargs={"enable_thinking": False})
    message = (await http.post(CHAT, json=body)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Four."}
    assert client.requests[0].chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("name", ["return_tensors", "truncation", "max_length", "tokenize", "messages"])
async def test_chat_template_kwargs_that_are_rendering_parameters_are_a_400_naming_them(
    http: httpx.AsyncClient, client: ScriptedClient, name: str
) -> None:
    reply = await http.post(CHAT, json=chat_body(chat_template_kwargs={name: 2}))
    assert reply.status_code == 400
    assert name in reply.json()["error"]["message"] and reply.json()["error"]["param"] == "chat_template_kwargs"
    assert client.requests == []
