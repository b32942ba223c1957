"""OpenAI semantics over generation outputs: responses, chunks, finish reasons, usage.

No HTTP types here; ``app.py`` frames what these functions return.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from llgtriton import wire
from proxy.errors import InternalError
from proxy.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReasonName,
    FunctionCall,
    ToolCall,
    Usage,
    new_id,
    now,
)
from proxy.tools import ToolCallStream, ToolPlan, parse_calls
from proxy.translate import chat_generation, completion_generation
from proxy.triton_client import GenerationClient


async def _final(outputs: AsyncIterator[wire.GenerationOutput]) -> tuple[str, wire.GenerationOutput]:
    """All text of a generation and its last output (which carries the finish reason and counts)."""
    parts: list[str] = []
    last: wire.GenerationOutput | None = None
    async for output in outputs:
        parts.append(output.text)
        last = output
    if last is None or last.finish_reason is None:
        raise InternalError("the generation ended without a finish reason")
    return "".join(parts), last


def _usage(output: wire.GenerationOutput) -> Usage:
    return Usage.of(output.prompt_tokens, output.completion_tokens)


def _finish(reason: wire.FinishReason, called_tools: bool) -> FinishReasonName:
    """``tool_calls`` when the model completed its calls; a call cut short by ``max_tokens`` stays ``length``."""
    return "tool_calls" if called_tools and reason is wire.FinishReason.STOP else reason.value


def _assistant(
    plan: ToolPlan | None, text: str, reason: wire.FinishReason
) -> tuple[AssistantMessage, FinishReasonName]:
    calls = parse_calls(plan, text) if plan is not None else None
    if not calls:
        return AssistantMessage(content=text), reason.value
    tool_calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]
    return AssistantMessage(content=None, tool_calls=tool_calls), _finish(reason, True)


class Generations:
    """Serves chat and text completions through a :class:`GenerationClient`."""

    def __init__(self, client: GenerationClient, model_name: str) -> None:
        self._client = client
        self.model_name = model_name

    async def chat(self, request: ChatCompletionRequest) -> ChatCompletion:
        completion_id = new_id("chatcmpl")
        translation = chat_generation(request)
        text, last = await _final(self._client.generate(translation.generation, completion_id))
        assert last.finish_reason is not None
        message, finish = _assistant(translation.tools, text, last.finish_reason)
        return ChatCompletion(
            id=completion_id,
            created=now(),
            model=self.model_name,
            choices=[ChatChoice(index=0, message=message, finish_reason=finish)],
            usage=_usage(last),
        )

    async def chat_stream(self, request: ChatCompletionRequest) -> AsyncIterator[ChatCompletionChunk]:
        completion_id, created = new_id("chatcmpl"), now()

        def chunk(delta: ChatDelta, finish: FinishReasonName | None = None) -> ChatCompletionChunk:
            choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish)
            return ChatCompletionChunk(id=completion_id, created=created, model=self.model_name, choices=[choice])

        translation = chat_generation(request)
        tools = ToolCallStream(translation.tools) if translation.tools is not None else None
        last: wire.GenerationOutput | None = None
        async for output in self._client.generate(translation.generation, completion_id):
            if last is None:
                yield chunk(ChatDelta(role="assistant", content=""))
            if tools is not None:
                for delta in tools.feed(output.text):
                    yield chunk(delta)
            elif output.text:
                yield chunk(ChatDelta(content=output.text))
            last = output
        if last is None or last.finish_reason is None:
            raise InternalError("the generation ended without a finish reason")
        for delta in tools.finish() if tools is not None else []:
            yield chunk(delta)
        yield chunk(ChatDelta(), _finish(last.finish_reason, tools is not None and tools.calls > 0))
        if request.include_usage():
            yield ChatCompletionChunk(
                id=completion_id, created=created, model=self.model_name, choices=[], usage=_usage(last)
            )

    async def completion(self, request: CompletionRequest) -> Completion:
        completion_id = new_id("cmpl")
        text, last = await _final(self._client.generate(completion_generation(request), completion_id))
        assert last.finish_reason is not None
        return Completion(
            id=completion_id,
            created=now(),
            model=self.model_name,
            choices=[CompletionChoice(index=0, text=text, finish_reason=last.finish_reason.value)],
            usage=_usage(last),
        )

    async def completion_stream(self, request: CompletionRequest) -> AsyncIterator[Completion]:
        completion_id, created = new_id("cmpl"), now()

        def chunk(text: str, finish: wire.FinishReason | None = None) -> Completion:
            choice = CompletionChoice(index=0, text=text, finish_reason=finish.value if finish else None)
            return Completion(id=completion_id, created=created, model=self.model_name, choices=[choice])

        last: wire.GenerationOutput | None = None
        async for output in self._client.generate(completion_generation(request), completion_id):
            if output.text:
                yield chunk(output.text)
            last = output
        if last is None or last.finish_reason is None:
            raise InternalError("the generation ended without a finish reason")
        yield chunk("", last.finish_reason)
        if request.include_usage():
            yield Completion(id=completion_id, created=created, model=self.model_name, choices=[], usage=_usage(last))
