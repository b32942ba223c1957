"""Chat messages as the wire carries them (``chat_messages``): OpenAI's shape, calls and results included."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llgtriton.tools import PastCall


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[PastCall, ...] = ()  # an assistant message's calls
    tool_call_id: str | None = None  # the call a tool message answers


def message_json(message: ChatMessage) -> dict[str, Any]:
    value: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        value["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        value["tool_call_id"] = message.tool_call_id
    return value


def message_from_json(item: Any, where: str) -> ChatMessage:
    """One message of a decoded JSON list; raises ``ValueError`` naming ``where`` when it is malformed."""
    if not (isinstance(item, dict) and isinstance(item.get("role"), str)):
        raise ValueError(f"{where} needs a string 'role'")
    content = item.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string")
    call_id = item.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise ValueError(f"{where}.tool_call_id must be a string")
    calls = tuple(_past_call(call, f"{where}.tool_calls") for call in item.get("tool_calls") or [])
    return ChatMessage(role=item["role"], content=content, tool_calls=calls, tool_call_id=call_id)


def _past_call(call: Any, where: str) -> PastCall:
    """One of an assistant message's calls, in OpenAI's shape (``{id, function: {name, arguments}}``)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
        raise ValueError(f"{where} entries need a function with a string name")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = call.get("id")
    return PastCall(function["name"], arguments, call_id if isinstance(call_id, str) else None)


# apply_chat_template's own parameters, and the variables it sets itself: a request's chat_template_kwargs
# may hold template variables only (``return_tensors`` would change what it returns, ``truncation`` and
# ``max_length`` cut the prompt). tests/backend/test_chat_template.py checks this against transformers.
RENDERING_PARAMETERS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def refused_template_variable(variables: dict[str, Any]) -> str | None:
    """Why ``variables`` (a request's ``chat_template_kwargs``) cannot be passed to the template, or None."""
    for name in variables:
        if name in RENDERING_PARAMETERS:
            return f"chat_template_kwargs may hold template variables only; {name!r} is a rendering parameter"
    return None
