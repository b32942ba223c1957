"""Requests that must call a tool, in the model's own call format, and the check of their calls (issue 51).

The requests are prepared as the backend prepares a chat request with ``tool_choice: required``
(``GenerationService.prepare``: the model's chat template renders the tool, the grammar is the
call format's, the format's tags are kept in the text). A finished output is read the way the
proxy reads it (``proxy.tool_calls.read_answer``): it must hold at least one call, each naming the
tool with arguments that validate against its parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema

from backend.requests import EngineRequest
from backend.service import GenerationService
from llgtriton.messages import ChatMessage
from llgtriton.tool_formats import ToolCallFormat
from llgtriton.tools import Function, ToolMode, ToolRequest
from llgtriton.wire import GenerationRequest
from proxy.tool_calls import read_answer
from proxy.tools import ToolPlan

WEATHER = Function(
    "get_weather",
    "The current weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
)
TOOLS = ToolRequest((WEATHER,), ToolMode.REQUIRED)


@dataclass(frozen=True)
class ToolCallRequests:
    """Greedy streamed requests that must call the tool, prepared by the backend, and the format they call in."""

    requests: list[EngineRequest]
    form: ToolCallFormat

    @classmethod
    def prepared_by(cls, service: GenerationService, count: int, max_tokens: int) -> ToolCallRequests:
        requests = [
            service.prepare(
                GenerationRequest(
                    messages=(ChatMessage("user", f"What is the weather in city number {i}?"),),
                    tools=TOOLS,
                    max_tokens=max_tokens,
                    temperature=0.0,
                    stream=True,
                ),
                f"tools-{i}",
            )
            for i in range(count)
        ]
        return cls(requests, service.tool_format)

    def invalid(self, text: str) -> bool:
        """Whether a finished output fails to call the tool with valid arguments."""
        answer = read_answer(ToolPlan(TOOLS), text, self.form)
        if not answer.calls:
            return True
        for call in answer.calls:
            if call.name != WEATHER.name:
                return True
            try:
                jsonschema.validate(json.loads(call.arguments), WEATHER.parameters)
            except (ValueError, jsonschema.ValidationError):
                return True
        return False
