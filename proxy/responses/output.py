"""A chat completion's answer as a Response: its output items whole, or as the stream of events
the SDK's stream helpers and the Agents SDK consume.

Items come in the order the model wrote them: the thinking (``reasoning``), the text (``message``),
the calls (``function_call``). A stream opens an item when its first piece arrives and closes it
when the next one opens or the generation ends; every event carries a ``sequence_number``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from proxy.errors import ProxyError
from proxy.protocol import AssistantMessage, ChatCompletionChunk, ChatLogprobs, FinishReasonName, Usage
from proxy.responses.conversation import item_id
from proxy.responses.protocol import (
    IncompleteDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputTextPart,
    OutputTokensDetails,
    ReasoningTextPart,
    Response,
    ResponseError,
    ResponseUsage,
)


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


class ResponseEvent(BaseModel):
    """One streamed event: its type, its place in the stream, and the type's own fields."""

    model_config = ConfigDict(extra="allow")
    type: str
    sequence_number: int


def usage(chat_usage: Usage | None) -> ResponseUsage | None:
    if chat_usage is None:
        return None
    details = chat_usage.completion_tokens_details
    return ResponseUsage(
        input_tokens=chat_usage.prompt_tokens,
        output_tokens=chat_usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=details.reasoning_tokens if details else 0),
        total_tokens=chat_usage.total_tokens,
    )


def _logprobs(logprobs: ChatLogprobs | None) -> list[dict[str, Any]]:
    return [entry.model_dump(mode="json") for entry in (logprobs.content or [])] if logprobs is not None else []


def output_items(
    message: AssistantMessage, finish: FinishReasonName | None, logprobs: ChatLogprobs | None = None
) -> list[OutputItem]:
    """A finished chat message's output items."""
    status = "incomplete" if finish == "length" else "completed"
    items: list[OutputItem] = []
    if message.reasoning_content:
        thinking = ReasoningTextPart(text=message.reasoning_content)
        items.append(OutputReasoning(id=item_id("reasoning"), content=[thinking], status=status))
    calls = message.tool_calls or []
    if message.content or not (calls or items):
        part = OutputTextPart(text=message.content or "", logprobs=_logprobs(logprobs))
        items.append(OutputMessage(id=item_id("message"), status=status, content=[part]))
    items += [
        OutputFunctionCall(
            id=item_id("function_call"),
            call_id=call.id,
            name=call.function.name,
            arguments=call.function.arguments,
            status=status,
        )
        for call in calls
    ]
    return items


def finished(
    draft: Response, items: Sequence[OutputItem], finish: FinishReasonName | None, chat_usage: Usage | None
) -> Response:
    """``draft`` (the response as it began) with its output: completed, or incomplete when cut by the token limit."""
    cut = finish == "length"
    return draft.model_copy(
        update={
            "status": "incomplete" if cut else "completed",
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None,
            "output": list(items),
            "usage": usage(chat_usage),
        }
    )


def failed(draft: Response, error: ProxyError, items: Sequence[OutputItem] = ()) -> Response:
    return draft.model_copy(
        update={
            "status": "failed",
            "error": ResponseError(code=error.code or error.type, message=error.message),
            "output": list(items),
        }
    )


class _OpenItem:
    """The item a stream is writing: its place, and what it has so far."""

    def __init__(self, kind: str, index: int, call_id: str = "", name: str = "", known_id: str | None = None) -> None:
        self.kind = kind
        self.index = index
        self.id = known_id or item_id(kind)
        self.call_id = call_id
        self.name = name
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []

    def item(self, status: str) -> OutputItem:
        text = "".join(self.text)
        if self.kind == "reasoning":
            return OutputReasoning(id=self.id, content=[ReasoningTextPart(text=text)], status=status)
        if self.kind == "message":
            part = OutputTextPart(text=text, logprobs=self.logprobs)
            return OutputMessage(id=self.id, status=status, content=[part])
        return OutputFunctionCall(
            id=self.id,
            call_id=self.call_id,
            name=self.name,
            arguments=text,
            status=status,
        )

    def part(self, status: str) -> dict[str, Any]:
        """The item's content part (a message's text, the reasoning's text)."""
        item = self.item(status)
        assert isinstance(item, OutputMessage | OutputReasoning)
        return item.content[0].model_dump(mode="json")


class ResponseEvents:
    """Turns a chat stream's chunks into the Responses event sequence."""

    def __init__(self, draft: Response, first_sequence: int = 0) -> None:
        """``first_sequence``: the number of the first event (after those another writer sent)."""
        self._draft = draft
        self._sequence = first_sequence
        self._done: list[OutputItem] = []
        self._open: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # by the chat stream's tool-call index
        self._finish: FinishReasonName | None = None
        self._usage: Usage | None = None

    def _event(self, kind: str, **fields: Any) -> ResponseEvent:
        event = ResponseEvent(type=kind, sequence_number=self._sequence, **fields)
        self._sequence += 1
        return event

    def _response(self, response: Response) -> dict[str, Any]:
        return response.model_dump(mode="json")

    def start(self) -> list[ResponseEvent]:
        """``response.created`` as drafted (a background one is queued), then ``response.in_progress``."""
        running = self._draft.model_copy(update={"status": "in_progress"})
        return [
            self._event("response.created", response=self._response(self._draft)),
            self._event("response.in_progress", response=self._response(running)),
        ]

    def chunk(self, chunk: ChatCompletionChunk) -> list[ResponseEvent]:
        if chunk.usage is not None:
            self._usage = chunk.usage
        if not chunk.choices:
            return []
        choice = chunk.choices[0]
        delta = choice.delta
        events: list[ResponseEvent] = []
        if delta.reasoning_content:
            events += self._text("reasoning", delta.reasoning_content)
        if delta.content:
            logprobs = _logprobs(choice.logprobs)
            events += self._text("message", delta.content, logprobs)
        for call in delta.tool_calls or []:
            events += self._call(call.index, call.id, call.function.name, call.function.arguments or "")
        if choice.finish_reason is not None:
            self._finish = choice.finish_reason
        return events

    def _open_item(
        self, kind: str, call_id: str = "", name: str = "", known_id: str | None = None
    ) -> list[ResponseEvent]:
        events = self._close()
        self._open = _OpenItem(kind, len(self._done), call_id, name, known_id)
        item = self._open.item("in_progress").model_dump(mode="json")
        if kind != "function_call":
            item["content"] = []
        events.append(self._event("response.output_item.added", output_index=self._open.index, item=item))
        if kind != "function_call":
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=self._open.id,
                    output_index=self._open.index,
                    content_index=0,
                    part=self._open.part("in_progress"),
                )
            )
        return events

    def _text(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> list[ResponseEvent]:
        events = self._open_item(kind) if self._open is None or self._open.kind != kind else []
        assert self._open is not None
        self._open.text.append(text)
        fields: dict[str, Any] = {"item_id": self._open.id, "output_index": self._open.index, "content_index": 0}
        if kind == "message":
            self._open.logprobs += logprobs or []
            events.append(self._event("response.output_text.delta", **fields, delta=text, logprobs=logprobs or []))
        else:
            events.append(self._event("response.reasoning_text.delta", **fields, delta=text))
        return events

    def _call(
        self, index: int, call_id: str | None, name: str | None, arguments: str, known_id: str | None = None
    ) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        if call_id is not None:  # a call's first piece carries its id and name
            events += self._open_item("function_call", call_id, name or "", known_id)
            assert self._open is not None
            self._calls[index] = self._open
        item = self._calls[index]
        if arguments:
            item.text.append(arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=item.index,
                    delta=arguments,
                )
            )
        return events

    def whole_item(self, item: OutputItem) -> list[ResponseEvent]:
        """The events of an item written whole, its text or arguments in one delta (a replay), with its id."""
        if isinstance(item, OutputFunctionCall):
            events = self._call(len(self._calls), item.call_id, item.name, item.arguments, item.id)
        else:
            part = item.content[0]
            kind = "message" if isinstance(item, OutputMessage) else "reasoning"
            events = self._open_item(kind, known_id=item.id)
            if part.text:
                logprobs = part.logprobs if isinstance(part, OutputTextPart) else None
                events += self._text(kind, part.text, logprobs)
        return events + self._close(item.status)

    def _close(self, status: str = "completed") -> list[ResponseEvent]:
        """The events that finish the open item, if any."""
        item, self._open = self._open, None
        if item is None:
            return []
        fields: dict[str, Any] = {"item_id": item.id, "output_index": item.index}
        text = "".join(item.text)
        if item.kind == "message":
            events = [
                self._event("response.output_text.done", **fields, content_index=0, text=text, logprobs=item.logprobs)
            ]
        elif item.kind == "reasoning":
            events = [self._event("response.reasoning_text.done", **fields, content_index=0, text=text)]
        else:
            events = [self._event("response.function_call_arguments.done", **fields, name=item.name, arguments=text)]
        if item.kind != "function_call":
            part = item.part(status)
            events.append(self._event("response.content_part.done", **fields, content_index=0, part=part))
        done = item.item(status)
        self._done.append(done)
        dumped = done.model_dump(mode="json")
        events.append(self._event("response.output_item.done", output_index=item.index, item=dumped))
        return events

    def finish(self) -> tuple[list[ResponseEvent], Response]:
        """The events that end the stream, and the final response."""
        status = "incomplete" if self._finish == "length" else "completed"
        events = self._close(status)
        if not self._done:  # nothing was written: an empty message, as a whole response has
            events = self._open_item("message") + self._close(status)
        response = finished(self._draft, self._done, self._finish, self._usage)
        kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=self._response(response))], response

    def ended(self, response: Response) -> list[ResponseEvent]:
        """The events that end a stream of ``response`` as it was stored, after its items (a replay)."""
        events: list[ResponseEvent] = []
        if response.status == "failed" and response.error is not None:
            events.append(self._event("error", code=response.error.code, message=response.error.message, param=None))
        kind = {"failed": "response.failed", "completed": "response.completed"}.get(
            response.status,
            "response.incomplete",  # incomplete, or cancelled (the API has no event of its own)
        )
        return [*events, self._event(kind, response=self._response(response))]

    def fail(self, error: ProxyError) -> tuple[list[ResponseEvent], Response]:
        """The events that end a failed stream (an ``error`` event, then ``response.failed``), and the response."""
        events = self._close("incomplete")
        response = failed(self._draft, error, self._done)
        events.append(self._event("error", code=error.code or error.type, message=error.message, param=error.param))
        events.append(self._event("response.failed", response=self._response(response)))
        return events, response


def replayed(response: Response) -> list[ResponseEvent]:
    """The event sequence of a response that has ended, as a stream of it ends: each item whole, its text
    or arguments in one delta (``GET /v1/responses/{id}?stream=true``)."""
    events = ResponseEvents(
        response.model_copy(update={"status": "in_progress", "output": [], "usage": None, "error": None})
    )
    replay = events.start()
    for item in response.output:
        replay += events.whole_item(item)
    return replay + events.ended(response)
