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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llgtriton.wire import GuideType
from proxy.errors import InvalidRequestError
from proxy.protocol import NamedToolChoice, Tool, ToolChoice
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
    legacy_functions: bool = False  # asked for with ``functions``: answered with ``message.function_call``


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
