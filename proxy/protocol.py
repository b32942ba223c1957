"""OpenAI request and response bodies as pydantic models (the HTTP edge only).

Requests accept unknown fields (clients send vendor extensions) and the proxy logs their names;
known fields this build cannot honour are refused with a 400 rather than ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from llgtriton.messages import refused_template_variable
from llgtriton.tools import PastCall, arguments_value
from llgtriton.wire import (
    LOGIT_BIAS_BOUND,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    MAX_TOP_LOGPROBS,
)

# One prompt per request: text, a list of one text, token ids, or a list of one list of token ids.
_ONE_PROMPT: Any = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1}
_TOKEN_IDS: Any = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}, "minItems": 1}
_ONE_TOKEN_PROMPT: Any = {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1}
MAX_TOOLS = 128  # OpenAI's own limit on functions per request
MAX_N = 16  # choices per request: each is a full generation in the backend's batch
TOKEN_ID = r"^[0-9]+$"
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


def _integral(value: Any) -> Any:
    """1.0 is an integer in JSON Schema (and so in the OpenAPI document): accept it as 1."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Strict models refuse what a JSON schema refuses ("5" or true for an integer), except integral floats.
Integer = Annotated[int, BeforeValidator(_integral)]
# (bounds inside Annotated: pydantic drops them from the JSON schema of an optional validated int)
TokenCount = Annotated[int, Field(ge=1, le=INT32_MAX), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=0, le=UINT64_MAX), BeforeValidator(_integral)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_integral)]


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """OpenAI types optional fields "or null", and the SDK sends null for arguments passed as None:
        null takes the field's default (a completion's ``max_tokens`` 16, ``temperature`` 1, ...)."""
        if not isinstance(data, dict):
            return data
        defaulted = {
            field.alias or name
            for name, field in cls.model_fields.items()
            if not field.is_required() and field.default is not None
        }
        return {key: value for key, value in data.items() if value is not None or key not in defaulted}


def request_models(base: type[BaseModel] | None = None) -> list[type[BaseModel]]:
    """Every request model (a body or a part of one), for the OpenAPI document."""
    found: list[type[BaseModel]] = []
    for model in (base or RequestBody).__subclasses__():
        found += [model, *request_models(model)]
    return found


class TextPart(RequestBody):
    type: Literal["text"]
    text: str


class CalledFunction(RequestBody):
    name: str
    arguments: str | dict[str, Any] = "{}"  # JSON text, as OpenAI sends it (an object is accepted too)

    def parsed_arguments(self) -> Any:
        return self.arguments if not isinstance(self.arguments, str) else arguments_value(self.arguments)


class PastToolCall(RequestBody):
    """A call the assistant made earlier in the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(RequestBody):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[PastToolCall] | None = None
    tool_call_id: str | None = None
    function_call: CalledFunction | None = None  # OpenAI's deprecated single call

    def text(self) -> str:
        """The message's text (its parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def past_calls(self) -> tuple[PastCall, ...]:
        """The calls the assistant made in this message (the backend writes them as the model does)."""
        calls = [(call.id, call.function) for call in self.tool_calls or []]
        if self.function_call is not None:
            calls.append((None, self.function_call))
        return tuple(
            PastCall(function.name, json.dumps(function.parsed_arguments(), ensure_ascii=False), call_id)
            for call_id, function in calls
        )


class FunctionDefinition(RequestBody):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="1-64 letters, digits, '_' or '-'")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none means no arguments
    strict: bool | None = None  # arguments always follow the schema here, strict or not


class Tool(RequestBody):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestBody):
    name: str


class NamedToolChoice(RequestBody):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | None
# OpenAI's deprecated function calling: ``functions`` are tools, ``function_call`` their tool_choice.
FunctionChoice = Literal["none", "auto"] | NamedFunction | None


class StreamOptions(RequestBody):
    include_usage: bool = False


class JsonSchemaFormat(RequestBody):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestBody):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # structural_tag (vLLM's, SGLang's, TensorRT-LLM's): [{begin, schema, end}] and the strings that open them
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class StructuredOutputs(RequestBody):
    """vLLM's extension: exactly one of these constrains the output."""

    json_: dict[str, Any] | str | bool | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None  # a structural tag's JSON ({"structures": ..., "triggers": ...})
    # How JSON is laid out (vLLM's names): a regex for the whitespace between tokens, or none but ", " and ": ".
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False


class GenerationRequestBase(RequestBody):
    model: str
    max_tokens: TokenCount | None = None
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Integer = Field(
        0, ge=-1, le=INT32_MAX, description="Extension (vLLM): keep the k most likely tokens; 0 or -1 = off."
    )
    seed: Seed | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Integer = Field(1, ge=1, le=MAX_N)
    logit_bias: (
        dict[
            Annotated[str, Field(pattern=TOKEN_ID)], Annotated[float, Field(ge=-LOGIT_BIAS_BOUND, le=LOGIT_BIAS_BOUND)]
        ]
        | None
    ) = Field(None, max_length=MAX_LOGIT_BIAS_ENTRIES, json_schema_extra={"propertyNames": {"pattern": TOKEN_ID}})
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's older spellings of structured_outputs, still sent by many clients.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    ignore_eos: bool = Field(
        False,
        description="Extension (vLLM): end tokens do not end the output, max_tokens does (benchmarks send it); "
        "not with a constraint or tools.",
    )
    grammar_pressure: bool = Field(
        False,
        description="Extension (llgtriton): each choice reports how hard its constraint pushed the model "
        "(grammar_pressure: the mean and largest probability mass the mask removed per token, and how "
        "often the model's first choice was forbidden).",
    )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(GenerationRequestBase):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDefinition] | None = Field(None, max_length=MAX_TOOLS, description="Deprecated: tools.")
    function_call: FunctionChoice = Field(None, description="Deprecated: tool_choice.")
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), BeforeValidator(_integral)] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Variables for the model's chat template, e.g. {\"enable_thinking\": false} (vLLM's field)."
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        refused = refused_template_variable(value or {})
        if refused is not None:
            raise ValueError(refused)
        return value


class CompletionRequest(GenerationRequestBase):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] = Field(
        json_schema_extra={"anyOf": [{"type": "string"}, _ONE_PROMPT, _TOKEN_IDS, _ONE_TOKEN_PROMPT]}
    )
    # 0 generates nothing: with echo and logprobs, the prompt is only scored
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_integral)] | None = 16
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=5), BeforeValidator(_integral)] | None = None
    suffix: str | None = None
    best_of: Integer | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("the prompt is empty")
        if isinstance(value, list) and not isinstance(value[0], int) and len(value) != 1:
            raise ValueError("send one prompt per request (a list of exactly one string or list of token ids)")
        if isinstance(value, list) and isinstance(value[0], list) and not value[0]:
            raise ValueError("the prompt is empty")
        return value

    def prompt_text(self) -> str | None:
        """The prompt's text; None when it was given as token ids."""
        if isinstance(self.prompt, str):
            return self.prompt
        first = self.prompt[0]
        return first if isinstance(first, str) else None

    def prompt_token_ids(self) -> tuple[int, ...] | None:
        """The prompt's token ids, when it was given so."""
        first = self.prompt[0] if isinstance(self.prompt, list) else None
        if isinstance(first, int):
            return tuple(int(token) for token in self.prompt)  # type: ignore[arg-type]
        if isinstance(first, list):
            return tuple(first)
        return None


# Responses ----------------------------------------------------------------------------------


class ResponseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


FinishReasonName = Literal["stop", "length", "tool_calls", "function_call"]


class CompletionTokensDetails(ResponseBody):
    reasoning_tokens: int


class Usage(ResponseBody):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Of the completion tokens, the thinking's (given for an output that thought, as OpenAI gives it).
    completion_tokens_details: CompletionTokensDetails | None = Field(None, exclude_if=lambda value: value is None)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> Usage:
        details = CompletionTokensDetails(reasoning_tokens=reasoning_tokens) if reasoning_tokens else None
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            completion_tokens_details=details,
        )


class FunctionCall(ResponseBody):
    name: str
    arguments: str


class ToolCall(ResponseBody):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(ResponseBody):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = Field(None, exclude_if=lambda text: text is None)  # a reasoning model's thinking
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=lambda calls: calls is None)
    function_call: FunctionCall | None = Field(None, exclude_if=lambda call: call is None)


class TopLogprob(ResponseBody):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(ResponseBody):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(ResponseBody):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class GrammarPressureReport(ResponseBody):
    """How hard a choice's constraint pushed the model, over its ``tokens`` (extension)."""

    tokens: int
    mean_removed_mass: float  # of the model's own distribution (temperature 1), per token
    max_removed_mass: float
    first_choice_forbidden: int  # tokens where the grammar forbade the model's most likely token


def _absent(value: object) -> bool:
    return value is None


class ChatChoice(ResponseBody):
    index: int
    message: AssistantMessage
    finish_reason: FinishReasonName | None
    logprobs: ChatLogprobs | None = None
    grammar_pressure: GrammarPressureReport | None = Field(None, exclude_if=_absent)


class ChatCompletion(ResponseBody):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(ResponseBody):
    name: str | None = Field(None, exclude_if=lambda value: value is None)
    arguments: str | None = Field(None, exclude_if=lambda value: value is None)


class ToolCallDelta(ResponseBody):
    index: int
    id: str | None = Field(None, exclude_if=lambda value: value is None)
    type: Literal["function"] | None = Field(None, exclude_if=lambda value: value is None)
    function: FunctionCallDelta


class ChatDelta(ResponseBody):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = Field(None, exclude_if=lambda text: text is None)  # a reasoning model's thinking
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=lambda calls: calls is None)
    function_call: FunctionCallDelta | None = Field(None, exclude_if=lambda call: call is None)


class ChatChunkChoice(ResponseBody):
    index: int
    delta: ChatDelta
    finish_reason: FinishReasonName | None = None
    logprobs: ChatLogprobs | None = None
    grammar_pressure: GrammarPressureReport | None = Field(None, exclude_if=_absent)  # with the finish


class ChatCompletionChunk(ResponseBody):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(ResponseBody):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for the prompt's first token (echo), which nothing scores
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(ResponseBody):
    index: int
    text: str
    finish_reason: FinishReasonName | None
    logprobs: CompletionLogprobs | None = None
    grammar_pressure: GrammarPressureReport | None = Field(None, exclude_if=_absent)


class Completion(ResponseBody):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(ResponseBody):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llgtriton"


class ModelList(ResponseBody):
    object: Literal["list"] = "list"
    data: list[ModelCard]
