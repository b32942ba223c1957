"""Function calling: a request's tools as the backend constrains them, and as the proxy reads them back.

- ``tool_choice`` naming a function: the output is that function's arguments, constrained by
  its JSON schema.
- ``required``: the output is one or more calls (one when ``parallel_tool_calls`` is false), each
  constrained by its function's schema.
- ``auto``: the model answers in plain text (or the JSON answer format), or calls functions.
- ``none``: no constraint, no tool calls.

The backend writes, renders and constrains the calls in the model's own format
(``llgtriton.tool_formats``), and is the one to build and compile their grammar
(``llgtriton.request_grammar``): a schema it refuses comes back as a 400 naming ``tools`` before
the first output. The plan here checks what needs no grammar and says how to read the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llgtriton.tools import Function, ToolMode, ToolRequest
from proxy.errors import InvalidRequestError
from proxy.protocol import NamedToolChoice, Tool, ToolChoice
from proxy.schemas import closed_objects

_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    request: ToolRequest  # what the backend is sent
    legacy_functions: bool = False  # asked for with ``functions``: answered with ``message.function_call``
    json_answer: bool = False  # AUTO with a JSON answer format: the output is the answer or calls, whole

    @property
    def calls_at_start_only(self) -> bool:
        """Whether calls can begin only where the output begins (the grammar is ``calls | answer``)."""
        return self.json_answer and self.mode is ToolMode.AUTO

    @property
    def mode(self) -> ToolMode:
        return self.request.mode

    @property
    def functions(self) -> tuple[Function, ...]:
        return self.request.functions


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


def plan_tools(
    tools: Sequence[Tool] | None, tool_choice: ToolChoice, parallel: bool | None, answer_schema: str | None = None
) -> ToolPlan | None:
    """The tools a request may call; None when no tool can be called.

    ``answer_schema`` (JSON text), from ``response_format``: under ``auto`` the model answers in that
    format or calls functions, as OpenAI does; ``required`` and a named function call regardless.
    """
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if choice in ("required", "auto"):
        request = ToolRequest(functions, ToolMode(choice), True if parallel is None else parallel)
    else:
        assert isinstance(choice, NamedToolChoice)  # the request model admits nothing else
        name = choice.function.name
        chosen = tuple(f for f in functions if f.name == name)
        if not chosen:
            raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
        request = ToolRequest(chosen, ToolMode.NAMED, False)
    return ToolPlan(request, json_answer=answer_schema is not None and request.mode is ToolMode.AUTO)
