"""OpenAI's Responses API bodies as pydantic models: the request, its input items, the response
object and its output items. Streaming events are built in ``proxy.responses.events``.

Input items and tools are parsed one by one by their ``type`` (``proxy.responses.conversation``), so
that an item or a tool this server cannot serve is refused by name (``input.3.type``) rather
than lost in a union's validation errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from llgtriton.wire import MAX_STOP_STRINGS, MAX_TEMPERATURE, MAX_TOP_LOGPROBS
from proxy.protocol import MAX_TOOLS, Integer, RequestBody, ResponseBody, Seed, TokenCount

MAX_METADATA_KEYS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MetadataKey = Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA_KEYS)]
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "cancelled", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


# Request ------------------------------------------------------------------------------------


class InputText(RequestBody):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None  # output_text that a client sends back
    logprobs: list[Any] | None = None


class Refusal(RequestBody):
    type: Literal["refusal"]
    refusal: str


class MessageItem(RequestBody):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText | Refusal]
    id: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, InputText) else part.refusal for part in self.content)


class FunctionCallItem(RequestBody):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(RequestBody):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


class ReasoningText(RequestBody):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(RequestBody):
    """Thinking from an earlier turn, sent back; chat templates drop earlier thinking, and so does the prompt."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(RequestBody):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="1-64 letters, digits, '_' or '-'")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # arguments always follow the schema here, strict or not


class NamedFunctionChoice(RequestBody):
    type: Literal["function"]
    name: str


class TextFormat(RequestBody):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    structures: list[dict[str, Any]] | None = None  # structural_tag, as in chat's response_format
    triggers: list[str] | None = None


class TextConfig(RequestBody):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(RequestBody):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(RequestBody):
    model: str
    input: str | list[dict[str, Any]] = Field(
        description="Text, or a list of items: messages (text parts), function_call, function_call_output, reasoning."
    )
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = Field(None, description="Extension: the sampling seed.")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="Extension: stop strings."
    )
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    metadata: Metadata | None = None
    user: str | None = None
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool = True
    previous_response_id: str | None = None
    background: bool = False
    stream: bool = False
    include: list[str] | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: Integer | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None


# Response -----------------------------------------------------------------------------------


class OutputTextPart(ResponseBody):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ReasoningTextPart(ResponseBody):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputMessage(ResponseBody):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextPart]


class OutputFunctionCall(ResponseBody):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class OutputReasoning(ResponseBody):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningTextPart]
    status: ItemStatus


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning


class InputTokensDetails(ResponseBody):
    cached_tokens: int = 0


class OutputTokensDetails(ResponseBody):
    reasoning_tokens: int = 0


class ResponseUsage(ResponseBody):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(ResponseBody):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(ResponseBody):
    code: str
    message: str


class Response(ResponseBody):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str]
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any]
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None


class DeletedResponse(ResponseBody):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(ResponseBody):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
