"""Requests that must call a tool, in the model's own call format, and the check of their calls (issue 51).

The prompt is rendered with the tool by the model's chat template, the grammar is the one the
backend builds for ``tool_choice: required`` (``llgtriton.request_grammar``), and a finished output is
read the way the proxy reads it (``proxy.tool_calls.read_answer``): it must hold at least one call,
each naming the tool with arguments that validate against its parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema

from backend.chat_template import ChatTemplate
from llgtriton.messages import ChatMessage
from llgtriton.request_grammar import request_grammar
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


@dataclass(frozen=True)
class ToolCallRequests:
    """Prompts that offer the tool, the grammar that makes the model call it, and what the text keeps."""

    prompts: list[list[int]]
    grammar: str
    kept_tokens: frozenset[int]
    tools: ToolRequest
    form: ToolCallFormat

    @classmethod
    def for_template(cls, template: ChatTemplate, count: int) -> ToolCallRequests:
        tools = ToolRequest((WEATHER,), ToolMode.REQUIRED)
        prompts = [
            template.render([ChatMessage("user", f"What is the weather in city number {i}?")], tools)
            for i in range(count)
        ]
        grammar = request_grammar(
            GenerationRequest(prompt="", tools=tools), template.tool_format, template.special_tokens, None
        )
        assert grammar is not None  # tools always make a grammar
        form = template.tool_format
        tags = [tag for tag in form.tags if tag != form.marker]  # as the backend keeps them for the proxy
        kept = frozenset(template.special_tokens[tag] for tag in tags if tag in template.special_tokens)
        return cls(prompts, grammar, kept, tools, form)

    def invalid(self, text: str) -> bool:
        """Whether a finished output fails to call the tool with valid arguments."""
        answer = read_answer(ToolPlan(self.tools), text, self.form)
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
