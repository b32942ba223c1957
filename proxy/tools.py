"""Function calling: tools become a constraint going in and real ``tool_calls`` coming out.

- ``tool_choice`` naming a function: the output is that function's arguments, constrained by
  its JSON schema.
- ``required``: the output is a JSON list of ``{"name", "arguments"}`` calls, each constrained by
  its function's schema (one call when ``parallel_tool_calls`` is false).
- ``auto``: the model answers in plain text, or writes ``<tool_call>`` followed by that list.
- ``none``: no constraint, no tool calls.

The functions are described to the model in a system message, since most chat templates (the
embedded model's included) have no tools section.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llgtriton.wire import GuideType
from proxy.errors import InvalidRequestError
from proxy.protocol import ChatDelta, FunctionCallDelta, NamedToolChoice, Tool, ToolCallDelta, ToolChoice
from proxy.schemas import closed_objects

TOOL_CALL_MARKER = "<tool_call>"
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class ToolMode(enum.Enum):
    NAMED = "named"
    REQUIRED = "required"
    AUTO = "auto"


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    mode: ToolMode
    functions: tuple[Function, ...]
    parallel: bool
    guide_type: GuideType
    guide: str
    instructions: str


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def _functions(tools: Sequence[Tool]) -> tuple[Function, ...]:
    """The tools' functions; their shapes were checked when the request was parsed."""
    functions = tuple(
        Function(
            tool.function.name,
            tool.function.description or "",
            closed_objects(tool.function.parameters or _EMPTY_PARAMETERS),  # arguments are read by code
        )
        for tool in tools
    )
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise InvalidRequestError("function names must be unique", param="tools")
    return functions


def _rooted(node: Any, root: str) -> Any:
    """``node`` with every local ``$ref`` ("#...") moved under the JSON pointer ``root``."""
    if isinstance(node, list):
        return [_rooted(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    moved = {key: _rooted(value, root) for key, value in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        moved["$ref"] = "#" + root + ref[1:]
    return moved


def _calls_schema(functions: Sequence[Function], parallel: bool) -> dict[str, Any]:
    """A list of calls, each naming a function and holding its arguments.

    Each function's schema sits whole under ``$defs/fn<i>`` of the combined schema, its references
    rewritten to point there: pydantic's ``$defs``, older ``definitions`` and ``#`` itself still
    resolve, and two functions' definitions of the same name do not collide.
    """
    definitions = {
        f"fn{index}": {k: v for k, v in _rooted(f.parameters, f"/$defs/fn{index}").items() if k != "$schema"}
        for index, f in enumerate(functions)
    }
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": f.name}, "arguments": {"$ref": f"#/$defs/fn{index}"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for index, f in enumerate(functions)
        ]
    }
    schema: dict[str, Any] = {"$defs": definitions, "type": "array", "items": call, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _describe(functions: Sequence[Function]) -> str:
    listed = [{"name": f.name, "description": f.description, "parameters": f.parameters} for f in functions]
    return "You can call these functions:\n" + json.dumps(listed, ensure_ascii=False)


def plan_tools(
    tools: Sequence[Tool] | None, tool_choice: ToolChoice, parallel: bool | None, answer_schema: str | None = None
) -> ToolPlan | None:
    """The constraint and instructions for a request's tools; None when no tool can be called.

    ``answer_schema`` (JSON text), from ``response_format``: under ``auto`` the model answers in that
    format or calls functions, as OpenAI does; ``required`` and a named function call regardless.
    """
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    parallel = True if parallel is None else parallel
    calls = json.dumps(_calls_schema(functions, parallel))
    call_format = 'a JSON list of calls, each {"name": <function name>, "arguments": {...}}'
    if choice == "none":
        return None
    if choice == "required":
        return ToolPlan(
            ToolMode.REQUIRED, functions, parallel, GuideType.JSON_SCHEMA, calls,
            f"{_describe(functions)}\nReply with {call_format}.",
        )  # fmt: skip
    if choice == "auto":
        answer = "TEXT\nTEXT: /[^<](.|\\n)*/" if answer_schema is None else f"answer\nanswer: %json {answer_schema}"
        grammar = f'start: "{TOOL_CALL_MARKER}" calls | {answer}\ncalls: %json {calls}'
        otherwise = "otherwise reply normally" if answer_schema is None else "otherwise reply with the JSON answer"
        return ToolPlan(
            ToolMode.AUTO, functions, parallel, GuideType.LARK, grammar,
            f"{_describe(functions)}\nTo call functions, reply with {TOOL_CALL_MARKER} followed by {call_format}; "
            f"{otherwise}.",
        )  # fmt: skip
    assert isinstance(choice, NamedToolChoice)  # the request model admits nothing else
    name = choice.function.name
    chosen = [f for f in functions if f.name == name]
    if not chosen:
        raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
    return ToolPlan(
        ToolMode.NAMED, tuple(chosen), False, GuideType.JSON_SCHEMA, json.dumps(chosen[0].parameters),
        f"{_describe(chosen)}\nReply with the JSON arguments for {name}.",
    )  # fmt: skip


def _call(item: Any) -> ParsedCall | None:
    if not (isinstance(item, dict) and isinstance(item.get("name"), str) and "arguments" in item):
        return None
    return ParsedCall(item["name"], json.dumps(item["arguments"], ensure_ascii=False))


def parse_calls(plan: ToolPlan, text: str) -> list[ParsedCall] | None:
    """The calls in a finished output, or None when it holds none (plain text, or cut short)."""
    if plan.mode is ToolMode.NAMED:
        return [ParsedCall(plan.functions[0].name, text)]
    if plan.mode is ToolMode.AUTO:
        if not text.startswith(TOOL_CALL_MARKER):
            return None
        text = text[len(TOOL_CALL_MARKER) :]
    if not text.startswith("["):
        return None
    # The complete calls, also of a list cut short by max_tokens: exactly what a stream delivers.
    calls = [_call(_json_or_none(element)) for element in JsonArraySplitter().feed(text)]
    return [c for c in calls if c is not None] or None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


class JsonArraySplitter:
    """Finds the top-level elements of a JSON array as its text streams in."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._current: list[str] = []

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


class ToolCallStream:
    """Turns streamed text deltas into content deltas and ``tool_calls`` deltas, per the plan's mode."""

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._splitter = JsonArraySplitter()
        self._pending = ""  # AUTO: text that might still turn out to be the call marker
        self._calling = plan.mode is not ToolMode.AUTO
        self._decided = plan.mode is not ToolMode.AUTO
        self._named_id = f"call_{uuid.uuid4().hex[:24]}"
        self._text: list[str] = []
        self.calls = 0

    def feed(self, text: str) -> list[ChatDelta]:
        self._text.append(text)
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
        deltas = []
        for element in self._splitter.feed(text):
            call = _call(_json_or_none(element))
            if call is not None:
                function = FunctionCallDelta(name=call.name, arguments=call.arguments)
                deltas.append(
                    ChatDelta(
                        tool_calls=[ToolCallDelta(index=self.calls, id=call.id, type="function", function=function)]
                    )
                )
                self.calls += 1
        return deltas

    def _named(self, text: str) -> list[ChatDelta]:
        if not text:
            return []
        if self.calls == 0:
            self.calls = 1
            function = FunctionCallDelta(name=self._plan.functions[0].name, arguments=text)
            return [
                ChatDelta(tool_calls=[ToolCallDelta(index=0, id=self._named_id, type="function", function=function)])
            ]
        return [ChatDelta(tool_calls=[ToolCallDelta(index=0, function=FunctionCallDelta(arguments=text))])]

    def finish(self) -> list[ChatDelta]:
        """What is still owed when the generation ends, so a stream says what the whole response says.

        An undecided AUTO prefix is plain text; a call list that produced no complete call is
        returned as content (as :func:`parse_calls` leaves it).
        """
        held, self._pending = self._pending, ""
        if self._calling and self.calls == 0:
            return [ChatDelta(content="".join(self._text))]
        return [ChatDelta(content=held)] if held else []
