"""Reasoning models through the proxy: the thinking is reasoning_content, never content."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton import wire
from llgtriton.reasoning import REASONING_FORMATS, ReasoningSplitter, Split, split_reasoning
from tests.proxy.scripted import ScriptedClient, chat_body, sse_events

CHAT = "/v1/chat/completions"

QWEN3, R1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]


def streamed(form: Any, chunks: list[str]) -> Split:
    splitter = ReasoningSplitter(form)
    parts = [splitter.feed(chunk) for chunk in chunks] + [splitter.finish()]
    return Split("".join(p.reasoning for p in parts), "".join(p.content for p in parts))


def chunked(text: str, data: st.DataObject) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=200, deadline=None)
@given(
    # (a thought that itself opens with the start tag reads as the tag: models re-open it)
    st.text(alphabet="ab <>/think\n", max_size=20).filter(
        lambda t: "</think>" not in t and not t.lstrip().startswith("<think>")
    ),
    st.text(alphabet="xy{}\n", max_size=12),
    st.data(),
)
def test_however_the_text_is_cut_the_thinking_and_the_answer_come_apart(
    thought: str, answer: str, data: st.DataObject
) -> None:
    expected = Split(thought, answer.lstrip("\n"))
    qwen_text = f"<think>{thought}</think>\n\n{answer}"
    assert streamed(QWEN3, chunked(qwen_text, data)) == split_reasoning(QWEN3, qwen_text) == expected
    r1_text = f"{thought}</think>{answer}"
    assert streamed(R1, chunked(r1_text, data)) == split_reasoning(R1, r1_text) == expected


def test_an_output_cut_short_while_thinking_is_all_reasoning() -> None:
    assert split_reasoning(QWEN3, "<think>Let me see") == Split("Let me see", "")
    assert split_reasoning(R1, "Let me see</thi") == Split("Let me see", "")
    assert split_reasoning(QWEN3, "<thi") == Split("", "")  # a tag cut short is neither part


def test_qwen3_without_thinking_is_all_answer() -> None:
    assert split_reasoning(QWEN3, "Four.") == Split("", "Four.")
    assert streamed(QWEN3, ["<", "b>bold</b>"]) == Split("", "<b>bold</b>")
    assert split_reasoning(None, "<think>x</think>y") == Split("", "<think>x</think>y")


def outputs(*texts: str, form: str = "qwen3") -> list[wire.GenerationOutput]:
    scripted = [wire.GenerationOutput(text) for text in texts[:-1]]
    scripted.append(wire.GenerationOutput(texts[-1], wire.FinishReason.STOP, prompt_tokens=3, completion_tokens=9))
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
