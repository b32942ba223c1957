"""A Responses request as the chat completion it is served as.

Input items (after the stored conversation that ``previous_response_id`` continues) become chat
messages; ``text.format``, ``tools`` and ``tool_choice`` become their chat fields, so structured
output and tool calls are constrained exactly as on chat completions. What this server cannot
honour (built-in tools, images, ``truncation: auto``, ...) is refused by name, never dropped.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from proxy.errors import InvalidRequestError, ProxyError, validation_error
from proxy.protocol import ChatCompletionRequest
from proxy.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)

_ITEM_TYPES: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
# The includes this server can honour: logprobs (with top_logprobs).
_INCLUDES = frozenset({"message.output_text.logprobs"})


def item_id(kind: str) -> str:
    return f"{_ID_PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}"


def _unsupported(message: str, param: str, code: str = "unsupported_parameter") -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def _validated(model: type[BaseModel], value: Any, param: str) -> Any:
    """``value`` as ``model``; a validation error names its place under ``param``."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        error = validation_error(exc)
        inner = error.param
        located = f"{param}.{inner}" if inner else param
        raise InvalidRequestError(f"{param}: {error.message}", param=located) from None


def parse_items(raw: str | Sequence[dict[str, Any]], param: str = "input") -> list[InputItem]:
    """Input items, each by its type (a bare ``{"role", "content"}`` is a message)."""
    if isinstance(raw, str):
        return [MessageItem(role="user", content=raw)]
    items: list[InputItem] = []
    for index, item in enumerate(raw):
        place = f"{param}.{index}"
        kind = item.get("type", "message" if "role" in item else None)
        model = _ITEM_TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise _unsupported(
                f"{place} is an item of type {kind!r}; this server takes message, function_call, "
                "function_call_output and reasoning items",
                f"{place}.type",
                "unsupported_item_type",
            )
        content = item.get("content")
        for part_index, part in enumerate(content if kind == "message" and isinstance(content, list) else []):
            part_type = part.get("type") if isinstance(part, dict) else None
            if part_type not in _TEXT_PARTS:
                raise _unsupported(
                    f"{place}.content.{part_index} is a {part_type!r} part; this model reads text only",
                    f"{place}.content.{part_index}.type",
                )
        items.append(_validated(model, item, place))
    return items


def stored_items(items: Sequence[InputItem]) -> list[dict[str, Any]]:
    """Items as they are stored and listed: JSON, each with an id."""
    stored = []
    for item in items:
        value = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        value["type"] = item.type
        if isinstance(item, MessageItem) and isinstance(item.content, str):  # listed as parts, as OpenAI lists them
            part = "output_text" if item.role == "assistant" else "input_text"
            value["content"] = [{"type": part, "text": item.content}]
        value.setdefault("id", item_id(item.type))
        stored.append(value)
    return stored


def chat_messages(instructions: str | None, items: Sequence[InputItem], own_from: int) -> list[dict[str, Any]]:
    """The conversation as chat messages; ``own_from``: where this request's own input starts
    (earlier items come from the stored conversation), for error messages."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    called: set[str] = set()
    for index, item in enumerate(items):
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            called.add(item.call_id)
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            if messages and messages[-1]["role"] == "assistant":  # the calls of one turn go in its one message
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in called:
                place = f"input.{index - own_from}" if index >= own_from else "previous_response_id"
                raise InvalidRequestError(
                    f"{place} answers call {item.call_id!r}, which no earlier function_call made",
                    param=f"{place}.call_id" if index >= own_from else place,
                )
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        # reasoning items: chat templates leave earlier thinking out of the prompt, and so does this
    return messages


def chat_tools(raw: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function tools in the chat shape; OpenAI's built-in tools are refused."""
    tools = []
    for index, tool in enumerate(raw):
        kind = tool.get("type")
        if kind != "function":
            raise _unsupported(
                f"tools.{index} is OpenAI's built-in tool {kind!r}; this server calls function tools only",
                f"tools.{index}.type",
                "unsupported_tool",
            )
        function: FunctionTool = _validated(FunctionTool, tool, f"tools.{index}")
        spec = {"name": function.name, "description": function.description, "parameters": function.parameters}
        tools.append({"type": "function", "function": {**spec, "strict": function.strict}})
    return tools


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _unsupported(
        f"tool_choice {choice.get('type')!r} is not supported; send auto, none, required or a function",
        "tool_choice",
    )


def _response_format(request: ResponsesRequest) -> dict[str, Any] | None:
    text_format = request.text.format if request.text is not None else None
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "structural_tag":
        return {"type": "structural_tag", "structures": text_format.structures, "triggers": text_format.triggers}
    if text_format.type == "json_object":
        return {"type": "json_object"}
    if text_format.schema_ is None:
        raise InvalidRequestError("text.format json_schema needs a schema", param="text.format.schema")
    spec = {"name": text_format.name, "description": text_format.description, "strict": text_format.strict}
    return {"type": "json_schema", "json_schema": {**spec, "schema": text_format.schema_}}


def refuse_unsupported(request: ResponsesRequest) -> None:
    """Fields this server knows but cannot honour: a 400 each, before any work."""
    refused = {
        "conversation": request.conversation is not None,
        "prompt": request.prompt is not None,
        "max_tool_calls": request.max_tool_calls is not None,
        "truncation": request.truncation == "auto",
        "text.verbosity": request.text is not None and request.text.verbosity not in (None, "medium"),
    }
    for param, is_refused in refused.items():
        if is_refused:
            raise _unsupported(
                f"{param} is not supported by this server; the request was refused rather than served without it",
                param,
            )
    for index, include in enumerate(request.include or []):
        if include not in _INCLUDES:
            supported = ", ".join(sorted(_INCLUDES))
            raise _unsupported(f"include {include!r} is not supported (supported: {supported})", f"include.{index}")
    if request.background and not request.store:
        raise InvalidRequestError("background responses are stored: send store true", param="background")


@dataclass(frozen=True)
class ChatPlan:
    """The chat completion a Responses request is served as."""

    request: ChatCompletionRequest
    logprobs: bool


def chat_request(request: ResponsesRequest, conversation: Sequence[InputItem], own_from: int) -> ChatPlan:
    logprobs = "message.output_text.logprobs" in (request.include or []) or bool(request.top_logprobs)
    thinking_off = request.reasoning is not None and request.reasoning.effort == "none"
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.instructions, conversation, own_from),
        "max_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "stop": request.stop,
        "user": request.user,
        "response_format": _response_format(request),
        "tools": chat_tools(request.tools) if request.tools else None,
        "tool_choice": _chat_tool_choice(request.tool_choice),
        "parallel_tool_calls": request.parallel_tool_calls,
        "logprobs": logprobs or None,
        "top_logprobs": request.top_logprobs if logprobs else None,
        "chat_template_kwargs": {"enable_thinking": False} if thinking_off else None,
        "stream": request.stream,
    }
    if not body["messages"]:
        raise InvalidRequestError("the input is empty", param="input")
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        raise renamed(validation_error(exc)) from None
    return ChatPlan(chat, logprobs)


# Chat fields a translation error may name, as the Responses request calls them.
_RENAMED = {"response_format": "text.format", "max_tokens": "max_output_tokens", "messages": "input"}


def renamed(error: ProxyError) -> ProxyError:
    """``error`` with the chat field it names given its Responses name."""
    if error.param is None:
        return error
    head, _, rest = error.param.partition(".")
    if head == "tools":  # tools.N.function.parameters -> tools.N.parameters
        param = error.param.replace(".function.", ".", 1)
    elif head == "messages":
        param = "input"
    else:
        param = ".".join(part for part in (_RENAMED.get(head, head), rest) if part)
    if param == error.param:
        return error
    message = error.message.replace(head, _RENAMED.get(head, head), 1) if head in _RENAMED else error.message
    copy = type(error)(message, param=param, code=error.code)
    return copy
