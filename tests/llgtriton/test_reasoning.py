"""llgtriton.reasoning: a constraint applies after the thinking, which stays free."""

from __future__ import annotations

import json

import pytest

from llgtriton.guides import grammar_for
from llgtriton.reasoning import REASONING_FORMATS, detect_reasoning, thinks
from llgtriton.wire import GuideType
from tests.llgtriton.matching import accepts

SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


def after_thinking(name: str, guide_type: GuideType = GuideType.JSON_SCHEMA, guide: str = SCHEMA) -> str:
    return REASONING_FORMATS[name].after_thinking(grammar_for(guide_type, guide))


def test_qwen3_thinks_freely_then_answers_in_the_constraint() -> None:
    grammar = after_thinking("qwen3")
    assert accepts(grammar, '<think>Four is {"n": "four"}, no: a number.</think>{"n": 4}')
    assert accepts(grammar, '{"n": 4}')  # thinking is optional
    assert not accepts(grammar, "<think>Four.</think>Four.")
    assert not accepts(grammar, "<think>Four.")  # no end without the answer


def test_deepseek_r1_starts_inside_the_thinking() -> None:
    grammar = after_thinking("deepseek_r1")
    assert accepts(grammar, 'Four, as JSON.</think>{"n": 4}')
    assert not accepts(grammar, '{"n": 4}')  # the thinking must end first
    assert not accepts(grammar, "Four.</think>Four.")


def test_a_lark_constraint_follows_the_thinking_too() -> None:
    grammar = after_thinking("qwen3", GuideType.LARK, 'start: "yes" | "no"')
    assert accepts(grammar, "<think>Hmm.</think>yes")
    assert not accepts(grammar, "<think>Hmm.</think>maybe")


def test_a_template_is_recognised_by_its_tags_and_its_generation_prompt() -> None:
    assert detect_reasoning("{{ '<think>' }}", "<|im_start|>assistant\n<think>\n") is REASONING_FORMATS["deepseek_r1"]
    assert detect_reasoning("{{ '<think>' }}", "<|im_start|>assistant\n") is REASONING_FORMATS["qwen3"]
    assert detect_reasoning("{{ messages }}", "<|im_start|>assistant\n") is None


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("qwen3", {}, True),
        ("qwen3", {"enable_thinking": False}, False),
        ("deepseek_r1", {"enable_thinking": False}, True),
    ],
)
def test_only_templates_that_can_turn_thinking_off_do(name: str, kwargs: dict[str, bool], expected: bool) -> None:
    assert thinks(REASONING_FORMATS[name], kwargs) is expected
    assert not thinks(None, {})
