"""OpenAI request and response bodies as pydantic models (the HTTP edge only).

Requests accept unknown fields (clients send vendor extensions) and the proxy logs their names;
known fields this build cannot honour are refused with a 400 rather than ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 16
MAX_TOOLS = 128  # OpenAI's own limit on functions per request
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message as the model sees it; earlier tool calls are written as the model writes them."""
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(part.text for part in self.content)
        if self.tool_calls:
            calls = [
                {"name": call.get("function", {}).get("name"), "arguments": _arguments(call)}
                for call in self.tool_calls
            ]
            text += "<tool_call>" + json.dumps(calls, ensure_ascii=False)
        return text


def _arguments(call: dict[str, Any]) -> Any:
    raw = call.get("function", {}).get("arguments", "{}")
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return raw


class StreamOptions(_Request):
    include_usage: bool = False


class JsonSchemaFormat(_Request):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Request):
    """vLLM's extension: exactly one of these constrains the output."""

    json_: dict[str, Any] | str | bool | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class _GenerationRequest(_Request):
    model: str
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(
        0, ge=-1, le=INT32_MAX, description="Extension (vLLM): keep the k most likely tokens; 0 or -1 = off."
    )
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    stop: str | list[str] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's older spellings of structured_outputs, still sent by many clients.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1, le=INT32_MAX)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("send one prompt per request (a list of exactly one string)")
        return value

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# Responses ----------------------------------------------------------------------------------


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


FinishReasonName = Literal["stop", "length", "tool_calls"]


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class FunctionCall(_Response):
    name: str
    arguments: str


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=lambda calls: calls is None)


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    finish_reason: FinishReasonName | None
    logprobs: None = None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(_Response):
    name: str | None = Field(None, exclude_if=lambda value: value is None)
    arguments: str | None = Field(None, exclude_if=lambda value: value is None)


class ToolCallDelta(_Response):
    index: int
    id: str | None = Field(None, exclude_if=lambda value: value is None)
    type: Literal["function"] | None = Field(None, exclude_if=lambda value: value is None)
    function: FunctionCallDelta


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=lambda calls: calls is None)


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    finish_reason: FinishReasonName | None = None
    logprobs: None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: FinishReasonName | None
    logprobs: None = None


class Completion(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llgtriton"


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]
