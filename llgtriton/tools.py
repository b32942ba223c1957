"""The tools a generation may call, and the calls made earlier, as the wire carries them.

The formats that write, constrain and read calls are :mod:`llgtriton.tool_formats`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any


class ToolMode(enum.StrEnum):
    NAMED = "named"  # the output is the named function's arguments
    REQUIRED = "required"  # the output is one or more calls
    AUTO = "auto"  # the output is plain text or calls


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolRequest:
    """The tools a generation may call, as the wire carries them (``tool_choice: none`` sends none)."""

    functions: tuple[Function, ...]
    mode: ToolMode
    parallel: bool = True

    def to_json(self) -> str:
        functions = [{"name": f.name, "description": f.description, "parameters": f.parameters} for f in self.functions]
        return json.dumps({"functions": functions, "mode": self.mode.value, "parallel": self.parallel})

    @classmethod
    def from_json(cls, payload: str) -> ToolRequest:
        try:
            value = json.loads(payload)
            functions = tuple(
                Function(str(f["name"]), str(f.get("description") or ""), dict(f.get("parameters") or {}))
                for f in value["functions"]
            )
            request = cls(functions, ToolMode(value["mode"]), bool(value.get("parallel", True)))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ValueError(f"tools must be JSON {{functions, mode, parallel}}: {str(exc)[:200]}") from None
        if not functions:
            raise ValueError("tools must name at least one function")
        if request.mode is ToolMode.NAMED and len(functions) != 1:
            raise ValueError("a named tool choice sends exactly that one function")
        return request

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as chat templates take them (``apply_chat_template(tools=...)``)."""
        return [
            {"type": "function", "function": {"name": f.name, "description": f.description, "parameters": f.parameters}}
            for f in self.functions
        ]


@dataclass(frozen=True)
class PastCall:
    """A call the assistant made earlier in the conversation."""

    name: str
    arguments: str  # JSON text
    id: str | None = None

    def parsed_arguments(self) -> Any:
        return arguments_value(self.arguments)


def arguments_value(arguments: str) -> Any:
    """A call's arguments as JSON reads them; the text itself when it is no JSON, or JSON too deep or
    too long to read (the model then sees what the client sent)."""
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
