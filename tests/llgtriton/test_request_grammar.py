"""llgtriton.request_grammar: the one place a request's grammar is built, tools in the model's own format."""

from __future__ import annotations

import json

import pytest

from llgtriton.guides import GuideError, check_grammar, grammar_for
from llgtriton.messages import ChatMessage
from llgtriton.reasoning import REASONING_FORMATS
from llgtriton.request_grammar import request_grammar
from llgtriton.tool_formats import FORMATS
from llgtriton.tools import Function, ToolMode, ToolRequest
from llgtriton.wire import GenerationRequest, GuideType
from tests.llgtriton.matching import accepts

WEATHER = Function("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
ASK = (ChatMessage("user", "Weather in Paris?"),)
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GENERIC_CALL = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'


def tools(mode: ToolMode = ToolMode.REQUIRED, **fields: object) -> GenerationRequest:
    return GenerationRequest(messages=ASK, tools=ToolRequest((WEATHER,), mode), **fields)  # type: ignore[arg-type]


def test_tools_are_constrained_to_the_models_own_format() -> None:
    hermes = request_grammar(tools(), FORMATS["hermes"], {}, None)
    assert hermes is not None and accepts(hermes, HERMES_CALL) and not accepts(hermes, GENERIC_CALL)
    generic = request_grammar(tools(ToolMode.AUTO), FORMATS["generic"], {}, None)
    assert generic is not None and accepts(generic, GENERIC_CALL) and not accepts(generic, HERMES_CALL)


def test_a_json_answer_format_is_what_a_plain_answer_must_be_beside_tools() -> None:
    request = tools(ToolMode.AUTO, guide_type=GuideType.JSON_SCHEMA, guide=json.dumps({"type": "integer"}))
    grammar = request_grammar(request, FORMATS["hermes"], {}, None)
    assert grammar is not None and accepts(grammar, "42") and accepts(grammar, HERMES_CALL)
    assert not accepts(grammar, "It is sunny.")


def test_without_tools_the_grammar_is_the_constraints_own() -> None:
    request = GenerationRequest(prompt="x", guide_type=GuideType.REGEX, guide="[0-9]+")
    assert request_grammar(request, FORMATS["hermes"], {}, None) == grammar_for(GuideType.REGEX, "[0-9]+")
    assert request_grammar(GenerationRequest(prompt="x"), FORMATS["hermes"], {}, None) is None


def test_a_reasoning_models_grammar_follows_its_thinking() -> None:
    request = GenerationRequest(messages=ASK, guide_type=GuideType.REGEX, guide="[0-9]+")
    grammar = request_grammar(request, FORMATS["hermes"], {}, REASONING_FORMATS["qwen3"])
    assert grammar is not None and accepts(grammar, "<think>Hmm.</think>42") and not accepts(grammar, "Hmm.")


def test_a_bad_tool_schema_is_refused_as_a_constraint_when_compiled() -> None:
    bad = Function("f", "", {"type": "foo"})
    request = GenerationRequest(messages=ASK, tools=ToolRequest((bad,), ToolMode.REQUIRED))
    grammar = request_grammar(request, FORMATS["hermes"], {}, None)
    assert grammar is not None
    with pytest.raises(GuideError, match="Invalid type: foo"):
        check_grammar(grammar)


def test_tools_beside_a_constraint_that_is_no_json_answer_are_refused_apart_from_bad_constraints() -> None:
    with pytest.raises(ValueError, match="JSON answer format") as refused:
        request_grammar(tools(ToolMode.AUTO, guide_type=GuideType.REGEX, guide="x"), FORMATS["hermes"], {}, None)
    assert not isinstance(refused.value, GuideError)
    with pytest.raises(GuideError, match="not valid JSON"):
        request_grammar(tools(ToolMode.AUTO, guide_type=GuideType.JSON_SCHEMA, guide="{"), FORMATS["hermes"], {}, None)
