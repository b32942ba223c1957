"""Reading tool calls out of generated text, whole or as it streams, per a :class:`ToolPlan`'s mode.

Call syntax never reaches ``content``: a call cut short by ``max_tokens`` comes back as a call with
the arguments written so far (as OpenAI returns it), and a call list that never got as far as a
function's name comes back as no call at all. In a stream, a call's name goes out as soon as it
is complete and its arguments as they are generated.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.protocol import ChatDelta, FunctionCallDelta, ToolCallDelta
from proxy.tools import TOOL_CALL_MARKER, ToolMode, ToolPlan

# How the call grammar writes a call (llguidance keeps the schema's property order): the name, then
# the arguments. Whitespace between the tokens is whatever the JSON grammar allows.
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_NAME_SO_FAR = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]*)$')


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
    """Finds the top-level elements of a JSON array as its text streams in."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._current: list[str] = []

    @property
    def current(self) -> str:
        """The element being written, so far ("" between elements)."""
        return "".join(self._current)

    def feed(self, text: str) -> Iterator[str]:
        for char in text:
            if self._depth >= 2 or (self._depth == 1 and char not in ",] \n\t\r"):
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
                if self._depth == 1 and self._current:
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
    """The calls in a JSON list of ``{"name", "arguments"}`` objects, as its text streams in."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = names
        self._splitter = JsonArraySplitter()
        self._open = False  # the last of ``calls`` is still being written
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> list[CallPiece]:
        pieces = [piece for element in self._splitter.feed(text) for piece in self._complete(element)]
        return pieces + self._progress(self._splitter.current)

    def finish(self) -> list[CallPiece]:
        """A call cut short inside its name still names its function when only one function's name fits."""
        so_far = _NAME_SO_FAR.match(self._splitter.current)
        if self._open or so_far is None:
            return []
        fitting = [name for name in self._names if name.startswith(so_far[1])]
        return self._advance(fitting[0], "") if len(fitting) == 1 else []

    def _complete(self, element: str) -> list[CallPiece]:
        head = _HEAD.match(element)
        if head is not None:
            pieces = self._advance(_name(head[1]), element[head.end() : -1].rstrip())
        else:  # written some other way: the call, if it is one, as JSON reads it
            item = _json_or_none(element)
            is_call = isinstance(item, dict) and isinstance(item.get("name"), str) and "arguments" in item
            pieces = self._advance(item["name"], json.dumps(item["arguments"], ensure_ascii=False)) if is_call else []
        self._open = False
        return pieces

    def _progress(self, current: str) -> list[CallPiece]:
        head = _HEAD.match(current)
        if head is not None:
            # Trailing whitespace waits: it may separate the arguments from the call's closing brace.
            return self._advance(_name(head[1]), current[head.end() :].rstrip())
        named = _NAME.match(current)
        return self._advance(_name(named[1]), "") if named is not None else []

    def _advance(self, name: str, arguments: str) -> list[CallPiece]:
        """The pieces that bring the open call (opened here if need be) to ``arguments``."""
        if not self._open:
            self._open = True
            self.calls.append(ParsedCall(name, arguments))
            return [CallPiece(len(self.calls) - 1, arguments, self.calls[-1].id, name)]
        sent = self.calls[-1].arguments
        if len(arguments) <= len(sent):
            return []
        self.calls[-1] = dataclasses.replace(self.calls[-1], arguments=arguments)
        return [CallPiece(len(self.calls) - 1, arguments[len(sent) :])]


def parse_calls(plan: ToolPlan, text: str) -> list[ParsedCall] | None:
    """The calls in a finished output; None when it is plain text (``auto`` without the marker).

    A list cut short by ``max_tokens`` gives its complete calls and the one it was writing:
    exactly what a stream of the same text delivers.
    """
    if plan.mode is ToolMode.NAMED:
        return [ParsedCall(plan.functions[0].name, text)] if text else []
    if plan.mode is ToolMode.AUTO:
        if not _calling(text):
            return None
        text = text[len(TOOL_CALL_MARKER) :]
    reader = CallListReader([f.name for f in plan.functions])
    reader.feed(text)
    reader.finish()
    return reader.calls


def _calling(text: str) -> bool:
    """Whether an ``auto`` output is (or, cut short, was becoming) a call list."""
    return text.startswith(TOOL_CALL_MARKER) or (text != "" and TOOL_CALL_MARKER.startswith(text))


class ToolCallStream:
    """Turns streamed text deltas into content deltas and tool-call deltas, per the plan's mode."""

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._reader = CallListReader([f.name for f in plan.functions])
        self._pending = ""  # AUTO: text that might still turn out to be the call marker
        self._calling = plan.mode is not ToolMode.AUTO
        self._decided = plan.mode is not ToolMode.AUTO
        self._named_id = new_call_id()
        self._named_started = False

    @property
    def calls(self) -> int:
        """Calls begun so far."""
        if self._plan.mode is ToolMode.NAMED:
            return int(self._named_started)
        return len(self._reader.calls)

    def feed(self, text: str) -> list[ChatDelta]:
        if not self._decided:
            self._pending += text
            if self._pending.startswith(TOOL_CALL_MARKER):
                self._decided = self._calling = True
                text, self._pending = self._pending[len(TOOL_CALL_MARKER) :], ""
            elif not TOOL_CALL_MARKER.startswith(self._pending):
                self._decided = True
                text, self._pending = self._pending, ""
            else:
                return []
        if not self._calling:
            return [ChatDelta(content=text)] if text else []
        if self._plan.mode is ToolMode.NAMED:
            return self._named(text)
        return [self._delta(piece) for piece in self._reader.feed(text)]

    def finish(self) -> list[ChatDelta]:
        """What is still owed when the generation ends; a marker cut short is call syntax, not content."""
        if self._calling and self._plan.mode is not ToolMode.NAMED:
            return [self._delta(piece) for piece in self._reader.finish()]
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
