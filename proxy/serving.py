"""OpenAI semantics over generation outputs: responses, chunks, finish reasons, usage.

No HTTP types here; ``app.py`` frames what these functions return.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from llgtriton import wire
from llgtriton.tool_formats import FORMATS, ToolCallFormat
from proxy.errors import InternalError, InvalidRequestError
from proxy.guards import GenerationSlots, LocalInFlight
from proxy.logprobs import chat_logprobs, completion_logprobs
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
    CompletionLogprobs,
    CompletionRequest,
    FinishReasonName,
    FunctionCall,
    GrammarPressureReport,
    ToolCall,
    Usage,
    new_id,
    now,
)
from proxy.tool_calls import ToolCallStream, read_answer
from proxy.tools import ToolPlan
from proxy.translate import Translation, chat_generation, completion_generation, translates_quickly
from proxy.triton_client import GenerationClient

T = TypeVar("T")


@dataclass(frozen=True)
class _Finished:
    """A whole generation: its answer's and its thinking's text, its last output (finish reason,
    counts) and its logprobs."""

    text: str
    last: wire.GenerationOutput
    logprobs: tuple[wire.TokenLogprob, ...] | None
    prompt_logprobs: wire.PromptLogprobs | None = None
    tool_call_format: str = ""
    reasoning: str = ""

    @property
    def reason(self) -> wire.FinishReason:
        assert self.last.finish_reason is not None
        return self.last.finish_reason


async def _final(outputs: AsyncIterator[wire.GenerationOutput]) -> _Finished:
    parts: list[str] = []
    thought: list[str] = []
    logprobs: list[wire.TokenLogprob] = []
    prompt_logprobs: wire.PromptLogprobs | None = None
    tool_call_format = ""
    last: wire.GenerationOutput | None = None
    async for output in outputs:
        parts.append(output.text)
        thought.append(output.reasoning)
        logprobs.extend(output.logprobs or ())
        prompt_logprobs = prompt_logprobs or output.prompt_logprobs
        tool_call_format = tool_call_format or output.tool_call_format
        last = output
    if last is None or last.finish_reason is None:
        raise InternalError("the generation ended without a finish reason")
    # Every output of a request that asked for logprobs carries them (possibly empty); others carry None.
    logprobs_read = None if last.logprobs is None else tuple(logprobs)
    return _Finished("".join(parts), last, logprobs_read, prompt_logprobs, tool_call_format, "".join(thought))


def _copies(generation: wire.GenerationRequest, n: int) -> list[wire.GenerationRequest]:
    """``n`` independent generations of one request; a given seed becomes n consecutive seeds."""
    if generation.seed is None:
        return [generation] * n
    return [dataclasses.replace(generation, seed=(generation.seed + i) % 2**64) for i in range(n)]


def _runs(generation: wire.GenerationRequest, n: int) -> int:
    """Generations to run for ``n`` choices: one when the prompt is only scored (every choice is the same)."""
    return 1 if generation.max_tokens == 0 else n


def _as_choice(chunk: Completion, index: int) -> Completion:
    """``chunk`` (of one choice) as choice ``index``'s."""
    return chunk.model_copy(update={"choices": [chunk.choices[0].model_copy(update={"index": index})]})


async def _cancel_and_wait(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until they have ended.

    ``asyncio.wait``, not ``gather``: if the caller is cancelled meanwhile, it gets its own
    CancelledError, message included, as an anyio cancel scope needs to recognise it (one of
    gather's would carry the message of a task cancelled here).
    """
    for task in tasks:
        task.cancel()
    if tasks:
        done, _ = await asyncio.wait(tasks)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a failure is reported by the caller's own error


async def _all(runs: Sequence[Awaitable[T]]) -> list[T]:
    """Every run's result; when one fails (or the caller is cancelled) the others are cancelled."""
    tasks = [asyncio.ensure_future(run) for run in runs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await _cancel_and_wait(tasks)


@dataclass(frozen=True)
class _Failure:
    error: Exception


_DONE = object()


async def _merged(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """Items of all ``streams`` as they come; a failure in one ends all of them."""
    if len(streams) == 1:  # no tasks: the one stream is closed as soon as this one is
        stream = streams[0]
        try:
            async for item in stream:
                yield item
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def pump(stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except Exception as exc:
            await queue.put(_Failure(exc))
        finally:
            queue.put_nowait(_DONE)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            got = await queue.get()
            if got is _DONE:
                running -= 1
            elif isinstance(got, _Failure):
                raise got.error
            else:
                yield cast(T, got)  # everything else in the queue came from a stream
    finally:
        await _cancel_and_wait(tasks)


def _request_id(completion_id: str, index: int, n: int) -> str:
    """The Triton request id of one choice: the response's id, suffixed with the choice when n > 1."""
    return completion_id if n == 1 else f"{completion_id}-{index}"


def _usage_of(lasts: Sequence[wire.GenerationOutput]) -> Usage:
    """One prompt, every choice's completion tokens."""
    completion = sum(last.completion_tokens for last in lasts)
    return Usage.of(lasts[0].prompt_tokens, completion, sum(last.reasoning_tokens for last in lasts))


def _finish(reason: wire.FinishReason, plan: ToolPlan | None, called: bool) -> FinishReasonName:
    """``tool_calls`` when the model completed its calls; a call cut short by ``max_tokens`` stays ``length``."""
    if plan is None or not called or reason is not wire.FinishReason.STOP:
        return reason.value
    return "function_call" if plan.legacy_functions else "tool_calls"


def call_format(name: str) -> ToolCallFormat:
    """The format a backend says it wrote calls in; ours when it says none (an older backend)."""
    form = FORMATS.get(name or "generic")
    if form is None:
        raise InternalError(f"the backend wrote tool calls in an unknown format {name!r}")
    return form


def _assistant(
    plan: ToolPlan | None, text: str, reason: wire.FinishReason, tool_call_format: str = ""
) -> tuple[AssistantMessage, FinishReasonName]:
    if plan is None:
        return AssistantMessage(content=text), reason.value
    answer = read_answer(plan, text, call_format(tool_call_format), cut_short=reason is wire.FinishReason.LENGTH)
    content = answer.content or None
    if answer.calls is None:
        return AssistantMessage(content=answer.content), reason.value
    finish = _finish(reason, plan, bool(answer.calls))
    if not answer.calls:  # cut short before a function's name: call syntax is never content
        return AssistantMessage(content=content), finish
    functions = [FunctionCall(name=c.name, arguments=c.arguments) for c in answer.calls]
    if plan.legacy_functions:
        return AssistantMessage(content=content, function_call=functions[0]), finish
    tool_calls = [ToolCall(id=c.id, function=function) for c, function in zip(answer.calls, functions, strict=True)]
    return AssistantMessage(content=content, tool_calls=tool_calls), finish


def _completion_logprobs(
    request: CompletionRequest,
    generated: Sequence[wire.TokenLogprob] | None,
    prompt: wire.PromptLogprobs | None,
    offset: int,
) -> CompletionLogprobs | None:
    """A completion choice's logprobs columns, when the request asked for them: the echoed prompt's
    (when given), then the generated tokens'."""
    if request.logprobs is None or (generated is None and prompt is None):
        return None
    return completion_logprobs(generated or (), request.logprobs, offset, prompt if request.echo else None)


def _echo(request: CompletionRequest, prompt: wire.PromptLogprobs | None) -> str:
    """The prompt, when the request echoes it: its text, or (given as token ids) the scored tokens' text."""
    if not request.echo:
        return ""
    text = request.prompt_text()
    if text is not None:
        return text
    if prompt is None:
        raise InternalError("the backend did not return the prompt's tokens to echo")
    return b"".join([prompt.first, *(entry.token for entry in prompt.rest)]).decode(errors="replace")


def pressure_report(output: wire.GenerationOutput) -> GrammarPressureReport | None:
    """The grammar's pressure on a choice, from its final output, when the request asked."""
    pressure = output.grammar_pressure
    if pressure is None:
        return None
    return GrammarPressureReport(
        tokens=pressure.tokens,
        mean_removed_mass=round(pressure.mean_removed, 6),
        max_removed_mass=round(pressure.max_removed, 6),
        first_choice_forbidden=pressure.first_choice_forbidden,
    )


_Request = TypeVar("_Request", ChatCompletionRequest, CompletionRequest)


async def _translated(translate: Callable[[_Request], Translation], request: _Request) -> Translation:
    """The request's translation: on the event loop when it compiles nothing (two thread hops less
    before the first token), else on a thread."""
    return translate(request) if translates_quickly(request) else await asyncio.to_thread(translate, request)


class Generations:
    """Serves chat and text completions through a :class:`GenerationClient`; ``n`` choices are ``n``
    generations run side by side."""

    def __init__(self, client: GenerationClient, model_name: str, slots: GenerationSlots | None = None) -> None:
        self._client = client
        self.model_name = model_name
        self.slots = slots or GenerationSlots(None, LocalInFlight())

    async def chat(self, request: ChatCompletionRequest) -> ChatCompletion:
        completion_id = new_id("chatcmpl")
        translation = await _translated(chat_generation, request)
        with self.slots.beyond_the_request(request.n - 1):
            try:
                finished = await _all(
                    [
                        _final(self._client.generate(generation, _request_id(completion_id, index, request.n)))
                        for index, generation in enumerate(_copies(translation.generation, request.n))
                    ]
                )
            except InvalidRequestError as exc:  # the backend's refusals name no request field
                raise translation.refusal(exc) from None
        choices = []
        for index, done in enumerate(finished):
            message, finish = _assistant(translation.tools, done.text, done.reason, done.tool_call_format)
            if done.reasoning:
                message = message.model_copy(update={"reasoning_content": done.reasoning})
            logprobs = chat_logprobs(done.logprobs) if done.logprobs is not None else None
            pressure = pressure_report(done.last)
            choices.append(
                ChatChoice(
                    index=index, message=message, finish_reason=finish, logprobs=logprobs, grammar_pressure=pressure
                )
            )
        return ChatCompletion(
            id=completion_id,
            created=now(),
            model=self.model_name,
            choices=choices,
            usage=_usage_of([done.last for done in finished]),
        )

    async def chat_stream(self, request: ChatCompletionRequest) -> AsyncGenerator[ChatCompletionChunk]:
        completion_id, created = new_id("chatcmpl"), now()
        translation = await _translated(chat_generation, request)
        generations = _copies(translation.generation, request.n)
        lasts: list[wire.GenerationOutput | None] = [None] * len(generations)

        async def choice(index: int, generation: wire.GenerationRequest) -> AsyncIterator[ChatCompletionChunk]:
            def chunk(
                delta: ChatDelta,
                finish: FinishReasonName | None = None,
                output: wire.GenerationOutput | None = None,
                pressure: GrammarPressureReport | None = None,
            ) -> ChatCompletionChunk:
                logprobs = chat_logprobs(output.logprobs) if output is not None and output.logprobs else None
                choice = ChatChunkChoice(
                    index=index, delta=delta, finish_reason=finish, logprobs=logprobs, grammar_pressure=pressure
                )
                return ChatCompletionChunk(id=completion_id, created=created, model=self.model_name, choices=[choice])

            def answer(text: str, output: wire.GenerationOutput | None = None) -> Iterator[ChatCompletionChunk]:
                if tools is not None:
                    yield from (chunk(delta) for delta in tools.feed(text))
                elif text or (output is not None and output.logprobs):
                    yield chunk(ChatDelta(content=text), output=output)

            tools: ToolCallStream | None = None
            last: wire.GenerationOutput | None = None
            async for output in self._client.generate(generation, _request_id(completion_id, index, request.n)):
                if last is None:  # the first response names the format of the calls
                    yield chunk(ChatDelta(role="assistant", content=""))
                    if translation.tools is not None:
                        tools = ToolCallStream(translation.tools, call_format(output.tool_call_format))
                if output.reasoning:  # the backend sends the thinking apart from the answer
                    yield chunk(ChatDelta(reasoning_content=output.reasoning))
                for item in answer(output.text, output):
                    yield item
                last = output
            if last is None or last.finish_reason is None:
                raise InternalError("the generation ended without a finish reason")
            cut_short = last.finish_reason is wire.FinishReason.LENGTH
            for delta in tools.finish(cut_short) if tools is not None else []:
                yield chunk(delta)
            called = tools is not None and tools.calls > 0
            yield chunk(
                ChatDelta(), _finish(last.finish_reason, translation.tools, called), pressure=pressure_report(last)
            )
            lasts[index] = last

        with self.slots.beyond_the_request(request.n - 1):
            try:
                async for item in _merged([choice(index, generation) for index, generation in enumerate(generations)]):
                    yield item
            except InvalidRequestError as exc:  # the backend's refusals name no request field
                raise translation.refusal(exc) from None
        if request.include_usage():
            usage = _usage_of([last for last in lasts if last is not None])
            yield ChatCompletionChunk(id=completion_id, created=created, model=self.model_name, choices=[], usage=usage)

    async def completion(self, request: CompletionRequest) -> Completion:
        completion_id = new_id("cmpl")
        translation = await _translated(completion_generation, request)
        generation = translation.generation
        runs = _runs(generation, request.n)
        with self.slots.beyond_the_request(runs - 1):
            try:
                finished = await _all(
                    [
                        _final(self._client.generate(copy, _request_id(completion_id, index, request.n)))
                        for index, copy in enumerate(_copies(generation, runs))
                    ]
                )
            except InvalidRequestError as exc:  # the backend's refusals name no request field
                raise translation.refusal(exc) from None
        finished = [finished[index % runs] for index in range(request.n)]  # a prompt scored once serves n
        choices = [
            CompletionChoice(
                index=index,
                text=_echo(request, done.prompt_logprobs) + done.text,
                finish_reason=done.reason.value,
                logprobs=_completion_logprobs(request, done.logprobs, done.prompt_logprobs, 0),
                grammar_pressure=pressure_report(done.last),
            )
            for index, done in enumerate(finished)
        ]
        return Completion(
            id=completion_id,
            created=now(),
            model=self.model_name,
            choices=choices,
            usage=_usage_of([done.last for done in finished]),
        )

    async def completion_stream(self, request: CompletionRequest) -> AsyncGenerator[Completion]:
        completion_id, created = new_id("cmpl"), now()
        translation = await _translated(completion_generation, request)
        runs = _runs(translation.generation, request.n)
        copies = _copies(translation.generation, runs)
        lasts: list[wire.GenerationOutput | None] = [None] * len(copies)

        async def choice(index: int, copy: wire.GenerationRequest) -> AsyncIterator[Completion]:
            def chunk(
                text: str, finish: wire.FinishReason | None = None, logprobs: Any = None, last: Any = None
            ) -> Completion:
                reason = finish.value if finish else None
                pressure = pressure_report(last) if last is not None else None
                choice = CompletionChoice(
                    index=index, text=text, finish_reason=reason, logprobs=logprobs, grammar_pressure=pressure
                )
                return Completion(id=completion_id, created=created, model=self.model_name, choices=[choice])

            offset = 0
            echoed = not request.echo
            last: wire.GenerationOutput | None = None
            async for output in self._client.generate(copy, _request_id(completion_id, index, request.n)):
                if not echoed:  # with the first output, which carries the prompt's logprobs when asked
                    echo = _echo(request, output.prompt_logprobs)
                    yield chunk(echo, logprobs=_completion_logprobs(request, (), output.prompt_logprobs, 0))
                    offset, echoed = len(echo), True
                if output.text or output.logprobs:
                    logprobs = _completion_logprobs(request, output.logprobs, None, offset)
                    yield chunk(output.text, logprobs=logprobs)
                    offset += len(output.text)
                last = output
            if last is None or last.finish_reason is None:
                raise InternalError("the generation ended without a finish reason")
            yield chunk("", last.finish_reason, last=last)
            lasts[index] = last

        with self.slots.beyond_the_request(runs - 1):
            try:
                async for item in _merged([choice(index, copy) for index, copy in enumerate(copies)]):
                    for index in range(item.choices[0].index, request.n, runs):  # a prompt scored once serves n
                        yield item if index == item.choices[0].index else _as_choice(item, index)
            except InvalidRequestError as exc:  # the backend's refusals name no request field
                raise translation.refusal(exc) from None
        if request.include_usage():
            usage = _usage_of([last for index in range(request.n) if (last := lasts[index % runs]) is not None])
            yield Completion(id=completion_id, created=created, model=self.model_name, choices=[], usage=usage)
