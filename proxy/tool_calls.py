"""Reading tool calls out of generated text, whole or as it streams, per a :class:`ToolPlan`'s mode
and the format the backend wrote them in (``llgtriton.tool_formats``: a JSON list of calls, or
calls each between tags).

Call syntax never reaches ``content``: a call cut short by ``max_tokens`` comes back as a call with
the arguments written so far (as OpenAI returns it), and a call list that never got as far as a
function's name comes back as no call at all. In a stream, a call's name goes out as soon as it
is complete and its arguments as they are generated.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llgtriton.tags import partial_tag
from llgtriton.tool_formats import FORMATS, ToolCallFormat
from llgtriton.tools import ToolMode
from proxy.protocol import ChatDelta, FunctionCallDelta, ToolCallDelta
from proxy.tools import ToolPlan

# How the call grammar writes a call (llguidance keeps the schema's property order): the name, then
# the arguments. Whitespace between the tokens is whatever the JSON grammar allows.
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_NAME_SO_FAR = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]*)$')
# Past this many characters an element can no longer be a call's head (a 64-character name and the
# whitespace JSON_OPTIONS allows around six tokens): the reader stops looking for one.
_HEAD_MAX_CHARS = 512


def _head(arguments_key: str) -> re.Pattern[str]:
    """A call's name and its arguments' key, up to where the arguments begin."""
    return re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"' + re.escape(arguments_key) + r'"\s*:\s*')


def _head_prefixes(names: Sequence[str], arguments_key: str) -> re.Pattern[str]:
    """Matches (whole) every text that could still grow into a call's head, per :func:`_head`."""
    opening = [r"\{", r"\s*", '"', *"name", '"', r"\s*", ":", r"\s*", '"']
    closing = ['"', r"\s*", ",", r"\s*", '"', *map(re.escape, arguments_key), '"', r"\s*", ":"]

    def nested(atoms: list[str]) -> str:
        pattern = ""
        for atom in reversed(atoms):
            pattern = f"{atom}(?:{pattern})?" if pattern else atom
        return pattern

    chains = [nested([*opening, *map(re.escape, name), *closing]) for name in names]
    return re.compile("|".join(f"(?:{chain})" for chain in chains))


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, or its beginning when the generation was cut short
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class CallPiece:
    """Part of a call as it streams: a call's first piece has its id and name."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


class JsonArraySplitter:
    """Finds the top-level elements of a JSON array as its text streams in; ``listed=False``: the
    top-level objects of a text, whatever stands between them (calls each between tags)."""

    def __init__(self, listed: bool = True) -> None:
        self._base = 1 if listed else 0  # the depth the elements start at
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._current: list[str] = []

    @property
    def current(self) -> str:
        """The element being written, so far ("" between elements)."""
        return "".join(self._current)

    @property
    def current_length(self) -> int:
        return len(self._current)

    def current_from(self, start: int) -> str:
        """The element being written, from character ``start`` on (what a stream has not read yet)."""
        return "".join(self._current[start:])

    def feed(self, text: str) -> Iterator[str]:
        base = self._base
        for char in text:
            if self._depth > base or (self._depth == base and (char == "{" if base == 0 else char not in ",] \n\t\r")):
                self._current.append(char)
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "[{":
                self._depth += 1
            elif char in "]}":
                self._depth -= 1
                if self._depth == base and self._current:
                    yield "".join(self._current)
                    self._current = []


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _name(literal: str) -> str:
    """The JSON string literal's body ``literal``, decoded."""
    decoded = _json_or_none(f'"{literal}"')
    return decoded if isinstance(decoded, str) else literal


class CallListReader:
    """The calls in a JSON list of ``{"name", "arguments"}`` objects (or, per ``form``, a sequence of
    them between tags), as its text streams in.

    Linear in the text: once a call's head (its name and the ``"arguments":`` key) is read, each
    feed reads only the characters after the ones already sent.
    """

    def __init__(self, names: Sequence[str], form: ToolCallFormat = FORMATS["generic"]) -> None:
        self._names = names
        self._key = form.arguments_key
        self._head = _head(form.arguments_key)
        self._splitter = JsonArraySplitter(form.listed)
        self._ids: list[str] = []
        self._call_names: list[str] = []
        self._arguments: list[list[str]] = []  # each call's arguments, as the pieces sent
        self._open = False  # the last call is still being written
        self._sent = 0  # characters of the open call's arguments sent
        self._arguments_at: int | None = None  # where the open call's arguments start in its element

    @property
    def count(self) -> int:
        """Calls begun so far."""
        return len(self._ids)

    @property
    def calls(self) -> list[ParsedCall]:
        return [
            ParsedCall(name, "".join(pieces), call_id)
            for name, pieces, call_id in zip(self._call_names, self._arguments, self._ids, strict=True)
        ]

    def feed(self, text: str) -> list[CallPiece]:
        pieces = [piece for element in self._splitter.feed(text) for piece in self._complete(element)]
        return pieces + self._progress()

    def finish(self) -> list[CallPiece]:
        """A call cut short inside its name still names its function when only one function's name fits."""
        so_far = _NAME_SO_FAR.match(self._splitter.current)
        if self._open or so_far is None:
            return []
        fitting = [name for name in self._names if name.startswith(so_far[1])]
        return self._advance(fitting[0], "") if len(fitting) == 1 else []

    def _complete(self, element: str) -> list[CallPiece]:
        head = self._head.match(element) if self._arguments_at is None else None
        if self._arguments_at is not None:
            pieces = self._advance(self._call_names[-1], element[self._arguments_at : -1].rstrip()[self._sent :])
        elif head is not None:
            pieces = self._advance(_name(head[1]), element[head.end() : -1].rstrip()[self._sent :])
        else:  # written some other way: the call, if it is one, as JSON reads it
            item = _json_or_none(element)
            is_call = isinstance(item, dict) and isinstance(item.get("name"), str) and self._key in item
            pieces = self._advance(item["name"], json.dumps(item[self._key], ensure_ascii=False)) if is_call else []
        self._open, self._sent, self._arguments_at = False, 0, None
        return pieces

    def _progress(self) -> list[CallPiece]:
        splitter = self._splitter
        if self._arguments_at is None:
            if splitter.current_length > _HEAD_MAX_CHARS:  # no head is this long: read it when complete
                return []
            current = splitter.current
            head = self._head.match(current)
            if head is None or head.end() == len(current):  # (more whitespace may come before the arguments)
                named = _NAME.match(current)
                return self._advance(_name(named[1]), "") if named is not None else []
            self._arguments_at = head.end()
            name = _name(head[1])
        else:
            name = self._call_names[-1]
        # Trailing whitespace waits: it may separate the arguments from the call's closing brace.
        return self._advance(name, splitter.current_from(self._arguments_at + self._sent).rstrip())

    def _advance(self, name: str, new: str) -> list[CallPiece]:
        """The pieces that open a call named ``name`` (unless it is open) and send ``new`` arguments."""
        if not self._open:
            self._open = True
            self._ids.append(new_call_id())
            self._call_names.append(name)
            self._arguments.append([new] if new else [])
            self._sent = len(new)
            return [CallPiece(len(self._ids) - 1, new, self._ids[-1], name)]
        if not new:
            return []
        self._arguments[-1].append(new)
        self._sent += len(new)
        return [CallPiece(len(self._ids) - 1, new)]


@dataclass(frozen=True)
class ReadAnswer:
    """A finished output read: its text before any call, and its calls (None: it holds no call syntax)."""

    content: str
    calls: list[ParsedCall] | None


def read_answer(
    plan: ToolPlan, text: str, form: ToolCallFormat = FORMATS["generic"], *, cut_short: bool = False
) -> ReadAnswer:
    """The text and the calls of a finished output (``cut_short``: by ``max_tokens``).

    Under ``auto``, text comes first and calls from the trigger on (or, in a format whose trigger is
    the call's first character, calls from the start). A trigger cut short by ``max_tokens`` is call
    syntax, never content, while text that merely ends like one is text; a list cut short gives its
    complete calls and the one it was writing: exactly what a stream of the same text delivers.
    """
    if plan.mode is ToolMode.NAMED:
        return ReadAnswer("", [ParsedCall(plan.functions[0].name, text)] if text else [])
    content = ""
    names = [f.name for f in plan.functions]
    if _triggered(plan, form) and _answers_or_calls_by_head(plan, form):
        head = _head(form.arguments_key).match(text)
        if head is None and not (cut_short and _head_prefixes(names, form.arguments_key).fullmatch(text)):
            return ReadAnswer(text, None)  # the answer, though it opens with "{" as calls do
    elif _triggered(plan, form):
        at_start = form.trigger_is_call or plan.calls_at_start_only
        found = _find_trigger(text, form.trigger, at_start)
        if found < 0:
            cut_trigger = cut_short or plan.mode is not ToolMode.AUTO
            cut = _partial_trigger(text, form.trigger, at_start) if cut_trigger else 0
            return ReadAnswer(text[: len(text) - cut], [] if cut else None)
        content, text = text[:found], text[found if form.trigger_is_call else found + len(form.trigger) :]
    reader = CallListReader(names, form)
    reader.feed(text)
    reader.finish()
    return ReadAnswer(content, reader.calls)


def _answers_or_calls_by_head(plan: ToolPlan, form: ToolCallFormat) -> bool:
    """Whether a JSON answer and the calls both open with "{" (``llama3_json`` under ``auto`` with a JSON
    answer format): then the output is calls when it opens with a call's head, else the answer."""
    return plan.calls_at_start_only and form.trigger_is_call


def _triggered(plan: ToolPlan, form: ToolCallFormat) -> bool:
    """Whether the calls begin with the format's trigger (always under ``auto``)."""
    return plan.mode is ToolMode.AUTO or (plan.mode is ToolMode.REQUIRED and form.always_triggered)


def _find_trigger(text: str, trigger: str, at_start_only: bool) -> int:
    """Where ``trigger`` begins in ``text`` (-1: nowhere; a trigger that counts only at the start
    is found only there)."""
    if at_start_only:
        return 0 if text.startswith(trigger) else -1
    return text.find(trigger)


def _partial_trigger(text: str, trigger: str, at_start_only: bool) -> int:
    """How many characters at the end of ``text`` begin ``trigger`` (all of them or none, for a
    trigger that counts only at the start)."""
    if at_start_only:
        return len(text) if text and trigger.startswith(text) else 0
    return partial_tag(text, trigger)


class ToolCallStream:
    """Turns streamed text deltas into content deltas and tool-call deltas, per the plan's mode."""

    def __init__(self, plan: ToolPlan, form: ToolCallFormat = FORMATS["generic"]) -> None:
        self._plan = plan
        self._trigger = form.trigger
        self._keeps_trigger = form.trigger_is_call
        self._at_start_only = form.trigger_is_call or plan.calls_at_start_only  # as the grammar allows calls
        names = [f.name for f in plan.functions]
        by_head = _triggered(plan, form) and _answers_or_calls_by_head(plan, form)
        self._head = _head(form.arguments_key) if by_head else None
        self._head_prefixes = _head_prefixes(names, form.arguments_key) if by_head else None
        self._reader = CallListReader(names, form)
        self._pending = ""  # AUTO: text that might still turn out to be the trigger
        self._text_only = False  # AUTO: the answer is text to its end
        self._calling = plan.mode is ToolMode.NAMED or not _triggered(plan, form)
        self._named_id = new_call_id()
        self._named_started = False

    @property
    def calls(self) -> int:
        """Calls begun so far."""
        if self._plan.mode is ToolMode.NAMED:
            return int(self._named_started)
        return self._reader.count

    def feed(self, text: str) -> list[ChatDelta]:
        deltas: list[ChatDelta] = []
        if not self._calling:
            text, content = self._before_trigger(text)
            deltas += [ChatDelta(content=content)] if content else []
            if not self._calling:
                return deltas
        if self._plan.mode is ToolMode.NAMED:
            return deltas + self._named(text)
        return deltas + [self._delta(piece) for piece in self._reader.feed(text)]

    def _before_trigger(self, text: str) -> tuple[str, str]:
        """AUTO: the content that is surely not the trigger, and (once the trigger has come) the text
        after it, which is calls; what might still begin the trigger is held back."""
        if self._text_only:
            return "", text
        pending = self._pending + text
        if not pending:  # nothing to decide on yet
            return "", ""
        if self._head is not None and self._head_prefixes is not None:
            return self._by_head(pending)
        found = _find_trigger(pending, self._trigger, self._at_start_only)
        if found >= 0:
            self._calling, self._pending = True, ""
            return pending[found if self._keeps_trigger else found + len(self._trigger) :], pending[:found]
        held = _partial_trigger(pending, self._trigger, self._at_start_only)
        # Calls could only have begun where the output began: the answer is text from now on.
        self._text_only = self._at_start_only and not held
        self._pending = pending[len(pending) - held :]
        return "", pending[: len(pending) - held]

    def _by_head(self, pending: str) -> tuple[str, str]:
        """An answer and calls that both open with "{": calls once a call's head is read, the answer as
        soon as the text can no longer become one."""
        assert self._head is not None and self._head_prefixes is not None
        if self._head.match(pending):
            self._calling, self._pending = True, ""
            return pending, ""
        if self._head_prefixes.fullmatch(pending):
            self._pending = pending
            return "", ""
        self._text_only, self._pending = True, ""
        return "", pending

    def finish(self, cut_short: bool = False) -> list[ChatDelta]:
        """What is still owed when the generation ends (``cut_short``: by ``max_tokens``); a trigger
        cut short is call syntax, not content, but text that merely ends like one is text."""
        if self._calling and self._plan.mode is not ToolMode.NAMED:
            return [self._delta(piece) for piece in self._reader.finish()]
        if self._pending and self._head is not None and cut_short:  # a call's head cut short: the call
            pieces = [*self._reader.feed(self._pending), *self._reader.finish()]
            return [self._delta(piece) for piece in pieces]
        if self._pending and self._plan.mode is ToolMode.AUTO and not cut_short:
            return [ChatDelta(content=self._pending)]
        return []

    def _named(self, text: str) -> list[ChatDelta]:
        if not text:
            return []
        if self._named_started:
            return [self._delta(CallPiece(0, text))]
        self._named_started = True
        return [self._delta(CallPiece(0, text, self._named_id, self._plan.functions[0].name))]

    def _delta(self, piece: CallPiece) -> ChatDelta:
        function = FunctionCallDelta(name=piece.name, arguments=piece.arguments)
        if self._plan.legacy_functions:
            return ChatDelta(function_call=function)
        kind = "function" if piece.id is not None else None
        return ChatDelta(tool_calls=[ToolCallDelta(index=piece.index, id=piece.id, type=kind, function=function)])
