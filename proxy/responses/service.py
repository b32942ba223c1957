"""The Responses API served through chat completions: create (whole, streamed or in the background),
and the stored responses' reads, deletes, input items and cancellation.

Each response is generated as one chat completion (``Generations``), so it gets the same
constraints, tool-call formats and reasoning split. A stored response keeps its whole input (the
conversation it continued, then its own items) beside its output: ``previous_response_id`` reads
the one record. Who may read it is the caller's API key (``owner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from proxy.errors import InvalidRequestError, NotFoundError, ProxyError, StoreUnavailableError, as_proxy_error
from proxy.protocol import ChatCompletionRequest, StreamOptions, now
from proxy.responses.conversation import ChatPlan, chat_request, parse_items, refuse_unsupported, renamed, stored_items
from proxy.responses.live import FINAL_EVENTS, LiveEvents
from proxy.responses.output import (
    ResponseEvent,
    ResponseEvents,
    failed,
    finished,
    new_response_id,
    output_items,
    replayed,
)
from proxy.responses.protocol import DeletedResponse, InputItemList, Response, ResponsesRequest
from proxy.responses.store import ACTIVE, ResponseStore, StoredResponse
from proxy.serving import Generations
from proxy.translate import checked_chat_generation

logger = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5  # how often a background response checks whether another process cancelled it
MAX_LISTED_ITEMS = 100


@dataclass(frozen=True)
class _Prepared:
    """A request made ready to run: the chat completion it is served as, and what is stored with it."""

    chat: ChatPlan
    draft: Response
    input_items: list[dict[str, Any]]
    owner: str


def _draft(request: ResponsesRequest, model: str, status: Literal["queued", "in_progress"]) -> Response:
    text = request.text.model_dump(mode="json", by_alias=True, exclude_none=True) if request.text else {}
    return Response(
        id=new_response_id(),
        created_at=now(),
        status=status,
        background=request.background,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        metadata=request.metadata or {},
        model=model,
        output=[],
        parallel_tool_calls=request.parallel_tool_calls is not False,
        previous_response_id=request.previous_response_id,
        reasoning=request.reasoning.model_dump(exclude_none=True) if request.reasoning else {},
        store=request.store,
        temperature=request.temperature,
        text={"format": {"type": "text"}, **text},
        tool_choice=request.tool_choice or "auto",
        tools=request.tools or [],
        top_p=request.top_p,
        user=request.user,
    )


class Responses:
    """``open_store`` is called on first use: a server nobody asks for a response opens no database."""

    def __init__(
        self, generations: Generations, open_store: Callable[[], ResponseStore], *, stale_after_s: float = 60.0
    ) -> None:
        """``stale_after_s``: a background response that nobody ran for that long (its proxy died) is failed
        by whoever reads it next."""
        self._generations = generations
        self._open_store = open_store
        self._stale_after_s = stale_after_s
        self._opened: ResponseStore | None = None
        self._background: dict[str, asyncio.Task[None]] = {}
        self._live: dict[str, LiveEvents] = {}  # the streamed background responses running here

    @property
    def _store(self) -> ResponseStore:
        if self._opened is None:
            self._opened = self._open_store()
        return self._opened

    async def _previous(self, request: ResponsesRequest, owner: str) -> StoredResponse | None:
        """The stored response ``previous_response_id`` continues, if the request names one."""
        if request.previous_response_id is None:
            return None
        previous = await self._store.get(request.previous_response_id, owner)
        if previous is None:
            raise NotFoundError(
                f"no stored response {request.previous_response_id!r}",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if previous.status in ACTIVE:
            raise InvalidRequestError(
                f"response {previous.id!r} is still {previous.status}", param="previous_response_id"
            )
        return previous

    async def _prepare(self, request: ResponsesRequest, owner: str) -> _Prepared:
        """Off the event loop: a long stored conversation takes a while to read back into messages."""
        refuse_unsupported(request)
        if request.model_extra:
            logger.info("ignoring unknown request fields: %s", ", ".join(sorted(request.model_extra)))
        previous = await self._previous(request, owner)
        return await asyncio.to_thread(self._plan, request, previous, owner)

    def _plan(self, request: ResponsesRequest, previous: StoredResponse | None, owner: str) -> _Prepared:
        earlier = [] if previous is None else [*previous.input_items, *previous.response.get("output", [])]
        history = parse_items(earlier, "previous_response_id")
        conversation = [*history, *parse_items(request.input)]
        chat = chat_request(request, conversation, len(history))
        status: Literal["queued", "in_progress"] = "queued" if request.background else "in_progress"
        draft = _draft(request, self._generations.model_name, status)
        return _Prepared(chat, draft, stored_items(conversation), owner)

    async def _keep(self, prepared: _Prepared, response: Response, request: ResponsesRequest) -> None:
        if not request.store:
            return
        try:
            await self._store.put(_record(prepared, response))
        except ValueError as exc:  # larger than the whole store
            message = f"the response cannot be stored: {exc}; send store false"
            raise InvalidRequestError(message, param="store") from None

    async def _keep_generated(self, prepared: _Prepared, response: Response, request: ResponsesRequest) -> Response:
        """Store a generated response. When the store fails or the response is larger than it, the client
        still gets what was generated, marked ``store: false`` (it cannot be retrieved or continued),
        rather than losing it to an error."""
        try:
            await self._keep(prepared, response, request)
        except (StoreUnavailableError, InvalidRequestError) as exc:
            logger.warning("response %s was generated but not stored: %s", response.id, exc.message)
            return response.model_copy(update={"store": False})
        return response

    async def _chat(self, chat: ChatCompletionRequest) -> Any:
        try:
            return await self._generations.chat(chat)
        except ProxyError as exc:
            raise renamed(exc) from None

    async def create(self, request: ResponsesRequest, owner: str) -> Response:
        prepared = await self._prepare(request, owner)
        if request.background:
            return await self._start_background(prepared, request)
        completion = await self._chat(prepared.chat.request)
        choice = completion.choices[0]
        items = output_items(choice.message, choice.finish_reason, choice.logprobs)
        response = finished(prepared.draft, items, choice.finish_reason, completion.usage)
        return await self._keep_generated(prepared, response, request)

    async def stream(self, request: ResponsesRequest, owner: str) -> AsyncGenerator[ResponseEvent]:
        """The event stream. Whatever goes wrong before the first chunk arrives (a bad constraint, a
        full queue) is an HTTP error; after it, an ``error`` and a ``response.failed`` event."""
        prepared = await self._prepare(request, owner)
        if request.background:
            # Its events outlive this stream: a client that drops it resumes them, here or on another proxy.
            draft = await self._start_background(prepared, request, streamed=True)
            async for event in self.resume(draft.id, owner, None):
                yield event
            return
        chunks = self._generations.chat_stream(_streamed(prepared.chat.request))
        try:
            first = await anext(chunks)
        except ProxyError as exc:
            await chunks.aclose()
            raise renamed(exc) from None
        events = ResponseEvents(prepared.draft)
        for event in events.start() + events.chunk(first):
            yield event
        try:
            async for chunk in chunks:
                for event in events.chunk(chunk):
                    yield event
        except Exception as exc:
            logger.warning("response %s failed: %s", prepared.draft.id, exc)
            ended, response = events.fail(renamed(as_proxy_error(exc)))
        else:
            ended, response = events.finish()
        finally:
            await chunks.aclose()
        kept = await self._keep_generated(prepared, response, request)
        if kept.store != response.store:  # not stored after all: the final event says so
            last = ended[-1]
            ended[-1] = last.model_copy(update={"response": {**getattr(last, "response", {}), "store": kept.store}})
        for event in ended:  # a stream always ends with its final event
            yield event

    async def _start_background(
        self, prepared: _Prepared, request: ResponsesRequest, streamed: bool = False
    ) -> Response:
        """Store it queued and start it. A ``streamed`` one logs its events, the first ones before this returns:
        a reader anywhere then finds a log to follow."""
        # Refused now, not failed later: the constraint and the tools are checked before it is queued.
        try:
            await asyncio.to_thread(checked_chat_generation, prepared.chat.request)
        except ProxyError as exc:
            raise renamed(exc) from None
        await self._keep(prepared, prepared.draft, request)
        response_id = prepared.draft.id
        run: Callable[[], Awaitable[None]] = lambda: self._generate_in_background(prepared)  # noqa: E731
        if streamed:
            events, live = ResponseEvents(prepared.draft), LiveEvents()
            live.add(events.start())
            try:
                await self._store.append_events(response_id, prepared.owner, _dumped(live.since(0)))
            except StoreUnavailableError:
                await self._forget(response_id, prepared.owner)
                raise
            self._live[response_id] = live
            run = lambda: self._stream_in_background(prepared, events, live)  # noqa: E731
        free_slot = self._generations.slots.handed_over()  # counted as the generation it is, until it ends
        task = asyncio.create_task(self._run_background(run, free_slot), name=f"background {response_id}")
        self._background[response_id] = task

        def ended(_: object) -> None:
            self._background.pop(response_id, None)
            live = self._live.pop(response_id, None)
            if live is not None:
                live.end()

        task.add_done_callback(ended)
        return prepared.draft

    async def _forget(self, response_id: str, owner: str) -> None:
        """Take back a response that could not be started (best effort: else it is found stale later)."""
        with contextlib.suppress(StoreUnavailableError):
            await self._store.delete(response_id, owner)

    async def _run_background(self, run: Callable[[], Awaitable[None]], free_slot: Callable[[], None]) -> None:
        try:
            await run()
        finally:
            free_slot()

    async def _stream_in_background(self, prepared: _Prepared, events: ResponseEvents, live: LiveEvents) -> None:
        """Generate as a stream, each chunk's events into ``live`` at once and into the store every
        ``CANCEL_POLL_S`` (which also shows that this proxy is alive and finds a cancel from elsewhere)."""
        draft = prepared.draft.model_copy(update={"status": "in_progress"})
        await self._finish(prepared, draft)
        generation = asyncio.create_task(self._stream_events(prepared, events, live))
        sent = len(live)
        try:
            while not generation.done():
                await asyncio.wait({generation}, timeout=CANCEL_POLL_S)
                sent, status = await self._send_events(prepared, live, sent)
                if status is None or status == "cancelled":  # cancelled by another process (or evicted)
                    generation.cancel()
            response = generation.result()
        except asyncio.CancelledError:
            generation.cancel()
            return
        await self._send_events(prepared, live, sent)  # its final events before its final state
        await self._finish(prepared, response)

    async def _stream_events(self, prepared: _Prepared, events: ResponseEvents, live: LiveEvents) -> Response:
        chunks = self._generations.chat_stream(_streamed(prepared.chat.request))
        try:
            async for chunk in chunks:
                live.add(events.chunk(chunk))
        except Exception as exc:
            logger.warning("background response %s failed: %s", prepared.draft.id, exc)
            ended, response = events.fail(renamed(as_proxy_error(exc)))
        else:
            ended, response = events.finish()
        finally:
            await chunks.aclose()
        live.add(ended)
        return response

    async def _send_events(self, prepared: _Prepared, live: LiveEvents, sent: int) -> tuple[int, str | None]:
        """Log the events the store lacks; how many it has now, and the response's status there."""
        unsent = live.since(sent)
        try:
            if unsent:
                status = await self._store.append_events(prepared.draft.id, prepared.owner, _dumped(unsent))
                return sent + len(unsent), status
            return sent, await self._store.touch(prepared.draft.id, prepared.owner)
        except StoreUnavailableError:  # (logged by the store) sent again next time; the generation goes on
            return sent, "in_progress"

    async def _generate_in_background(self, prepared: _Prepared) -> None:
        draft = prepared.draft.model_copy(update={"status": "in_progress"})
        await self._finish(prepared, draft)
        generation = asyncio.create_task(self._chat(prepared.chat.request))
        touched = time.monotonic()
        try:
            while not generation.done():
                await asyncio.wait({generation}, timeout=CANCEL_POLL_S)
                try:
                    # Now and then also a sign of life, so that no reader takes it for one whose proxy died.
                    if time.monotonic() - touched >= self._stale_after_s / 4:
                        touched = time.monotonic()
                        status = await self._store.touch(draft.id, prepared.owner)
                    else:
                        status = await self._store.status(draft.id, prepared.owner)
                except StoreUnavailableError:  # (logged by the store) the generation goes on meanwhile
                    continue
                if status is None or status == "cancelled":  # cancelled by another process (or evicted)
                    generation.cancel()
            completion = generation.result()
            choice = completion.choices[0]
            items = output_items(choice.message, choice.finish_reason, choice.logprobs)
            response = finished(draft, items, choice.finish_reason, completion.usage)
        except asyncio.CancelledError:
            generation.cancel()
            return
        except Exception as exc:
            logger.warning("background response %s failed: %s", draft.id, exc)
            response = failed(draft, as_proxy_error(exc))
        await self._finish(prepared, response)

    async def _finish(self, prepared: _Prepared, response: Response) -> None:
        """Store a background response's new state, unless it was cancelled meanwhile. Where that cannot
        be stored, its failure is (without its output and input, a small write), so that it does not
        stay ``in_progress``."""
        try:
            await self._store.finish(_record(prepared, response))
        except ValueError as exc:  # the output made it larger than the whole store: keep the failure
            too_large = failed(response, InvalidRequestError(f"the response cannot be stored: {exc}"))
            await self._store.finish(dataclasses.replace(_record(prepared, too_large), input_items=[]))
        except StoreUnavailableError as exc:
            unstored = failed(response, exc)
            try:
                await self._store.finish(dataclasses.replace(_record(prepared, unstored), input_items=[]))
            except StoreUnavailableError:
                logger.error(
                    "background response %s: neither its %s state nor its failure could be stored",
                    response.id,
                    response.status,
                )

    async def _stored(self, response_id: str, owner: str) -> StoredResponse:
        stored = await self._store.get(response_id, owner)
        if stored is None:
            raise NotFoundError(f"no stored response {response_id!r}", code="response_not_found")
        heard_before = time.time() - self._stale_after_s
        silent = stored.status in ACTIVE and stored.heartbeat_at < heard_before
        if silent and stored.response.get("background") and response_id not in self._background:
            return await self._fail_stale(stored, heard_before)
        return stored

    async def _fail_stale(self, stored: StoredResponse, heard_before: float) -> StoredResponse:
        """A response whose proxy has gone silent (it died), failed: once, in one transaction, unless its
        proxy spoke or it ended meanwhile."""
        lost = ProxyError(
            f"the proxy running this background response stopped: no word from it for {self._stale_after_s:g} s",
            code="server_error",  # (one of the codes OpenAI's clients know)
        )
        response = failed(Response.model_validate(stored.response), lost).model_dump(mode="json")
        updated = await self._store.fail_stale(stored.id, stored.owner, heard_before, response)
        if updated is None:
            return stored
        logger.warning("background response %s failed: %s", stored.id, lost.message)
        return updated

    async def get(self, response_id: str, owner: str) -> Response:
        return Response.model_validate((await self._stored(response_id, owner)).response)

    async def resume(self, response_id: str, owner: str, starting_after: int | None) -> AsyncGenerator[ResponseEvent]:
        """A stored response's events after ``starting_after``: what a client whose stream broke resumes from.

        A streamed background response's are its logged events, live while it runs (from memory on the
        proxy running it, from the store elsewhere); any other response's are made from it once it has
        ended (a background one is waited for)."""
        after = -1 if starting_after is None else starting_after
        stored = await self._stored(response_id, owner)  # a 404 before the stream starts
        live = self._live.get(response_id)
        if live is not None:
            async for event in live.follow(after):
                yield event
                after = event.sequence_number
                if event.type in FINAL_EVENTS:
                    return
        elif not await self._store.events(response_id, owner, -1, limit=1):
            while stored.status in ACTIVE:  # ended by its proxy, a cancel, or found stale
                await asyncio.sleep(CANCEL_POLL_S)
                stored = await self._stored(response_id, owner)
            for event in replayed(Response.model_validate(stored.response)):
                if event.sequence_number > after:
                    yield event
            return
        async for event in self._logged(response_id, owner, after):
            yield event

    async def _logged(self, response_id: str, owner: str, after: int) -> AsyncGenerator[ResponseEvent]:
        """Follow a response's event log in the store. One that ended without its final event logged
        (cancelled, or its proxy died) ends with the events of its stored state, numbered on."""
        while True:
            stored = await self._stored(response_id, owner)  # read first: once ended, its log is whole
            for dumped in await self._store.events(response_id, owner, after):
                event = ResponseEvent.model_validate(dumped)
                yield event
                after = event.sequence_number
                if event.type in FINAL_EVENTS:
                    return
            if stored.status not in ACTIVE:
                break
            await asyncio.sleep(CANCEL_POLL_S)
        log = await self._store.events(response_id, owner, -1)
        if log and log[-1]["type"] in FINAL_EVENTS:  # it was all sent before ``starting_after``
            return
        response = Response.model_validate(stored.response)
        for event in ResponseEvents(response, first_sequence=after + 1).ended(response):
            yield event

    async def delete(self, response_id: str, owner: str) -> DeletedResponse:
        if not await self._store.delete(response_id, owner):
            raise NotFoundError(f"no stored response {response_id!r}", code="response_not_found")
        return DeletedResponse(id=response_id)

    async def cancel(self, response_id: str, owner: str) -> Response:
        stored = await self._stored(response_id, owner)
        if not stored.response.get("background"):
            raise InvalidRequestError("only background responses can be cancelled", code="not_background")
        if stored.status in ACTIVE:
            cancelled = {**stored.response, "status": "cancelled"}
            updated = await self._store.cancel(response_id, owner, cancelled)
            stored = updated or stored
            task = self._background.get(response_id)
            if task is not None:
                task.cancel()
        return Response.model_validate(stored.response)

    async def input_items(
        self, response_id: str, owner: str, *, limit: int = 20, order: str = "desc", after: str | None = None
    ) -> InputItemList:
        if not 1 <= limit <= MAX_LISTED_ITEMS:
            raise InvalidRequestError(f"limit must be 1-{MAX_LISTED_ITEMS}", param="limit")
        if order not in ("asc", "desc"):
            raise InvalidRequestError("order must be asc or desc", param="order")
        items = (await self._stored(response_id, owner)).input_items
        items = items if order == "asc" else items[::-1]
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequestError(f"no input item {after!r} in this response", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        first_id = page[0].get("id") if page else None
        last_id = page[-1].get("id") if page else None
        return InputItemList(data=page, first_id=first_id, last_id=last_id, has_more=len(items) > limit)

    async def close(self) -> None:
        for task in list(self._background.values()):
            task.cancel()
        opened, self._opened = self._opened, None  # (an app started again opens it again)
        if opened is not None:
            await opened.close()


def _streamed(chat: ChatCompletionRequest) -> ChatCompletionRequest:
    return chat.model_copy(update={"stream_options": StreamOptions(include_usage=True)})


def _dumped(events: list[ResponseEvent]) -> list[dict[str, Any]]:
    return [event.model_dump(mode="json") for event in events]


def _record(prepared: _Prepared, response: Response) -> StoredResponse:
    return StoredResponse(
        response.id,
        prepared.owner,
        response.created_at,
        response.status,
        response.model_dump(mode="json"),
        prepared.input_items,
    )
