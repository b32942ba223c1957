"""A request's grammar, built in one place: its constraint, or its tools in the model's own call
format, after the thinking of a reasoning model.

The backend builds it with its model's formats and compiles it against the tokenizer; nothing
else builds a tools grammar, so no grammar is compiled that decoding never runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from llgtriton.guides import ANY_JSON_OBJECT, GuideError, grammar_for
from llgtriton.reasoning import ReasoningFormat
from llgtriton.tool_formats import ToolCallFormat
from llgtriton.wire import GenerationRequest, GuideType

TOOLS_NEED_A_JSON_ANSWER = "tools combine only with a JSON answer format (json_object or json_schema)"


def answer_schema(request: GenerationRequest) -> str | None:
    """The JSON schema (text) a plain answer must match beside tools; None: free text. Raises
    ``ValueError`` for a constraint that is no JSON answer format."""
    if request.guide_type is None:
        return None
    if request.guide_type is GuideType.JSON:
        return request.guide or json.dumps(ANY_JSON_OBJECT)
    if request.guide_type is GuideType.JSON_SCHEMA and request.guide:
        return request.guide
    raise ValueError(TOOLS_NEED_A_JSON_ANSWER)


def request_grammar(
    request: GenerationRequest,
    tool_format: ToolCallFormat,
    special: Mapping[str, int],
    reasoning: ReasoningFormat | None,
) -> str | None:
    """``request``'s llguidance grammar (None: unconstrained). Tools are constrained to
    ``tool_format``'s call syntax, with ``special`` (the tokenizer's special tokens among the formats'
    tags, by their text); under ``auto`` a JSON answer format is what a plain answer must be.

    Raises :class:`GuideError` for a constraint or tools that cannot be a grammar, and a plain
    ``ValueError`` for tools beside a constraint that is no JSON answer format.
    """
    if request.tools is not None:
        answer = answer_schema(request)
        try:
            lark = tool_format.grammar(request.tools, answer, special)
        except (ValueError, RecursionError) as exc:  # the answer schema is no JSON
            raise GuideError(f"the JSON answer format is not valid JSON: {exc}") from None
        grammar = grammar_for(GuideType.LARK, lark)
    elif request.guide_type is not None:
        grammar = grammar_for(request.guide_type, request.guide)
    else:
        return None
    if reasoning is None:
        return grammar
    try:
        return reasoning.after_thinking(grammar, special)
    except ValueError as exc:  # a constraint that cannot follow the thinking
        raise GuideError(str(exc)) from None
