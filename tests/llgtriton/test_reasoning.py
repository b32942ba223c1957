"""llgtriton.reasoning: a constraint applies after the thinking, which stays free."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton.guides import grammar_for
from llgtriton.reasoning import REASONING_FORMATS, ReasoningSplitter, Split, detect_reasoning, thinks
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


# The splitter: the backend sends the thinking apart from the answer ----------------------------

QWEN3, R1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]


def streamed(form: Any, chunks: list[str]) -> Split:
    splitter = ReasoningSplitter(form)
    parts = [splitter.feed(chunk) for chunk in chunks] + [splitter.finish()]
    return Split("".join(p.reasoning for p in parts), "".join(p.content for p in parts))


def chunked(text: str, data: st.DataObject) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=200, deadline=None)
@given(
    # (a thought that itself opens with the start tag reads as the tag: models re-open it)
    st.text(alphabet="ab <>/think\n", max_size=20).filter(
        lambda t: "</think>" not in t and not t.lstrip().startswith("<think>")
    ),
    st.text(alphabet="xy{}\n", max_size=12),
    st.data(),
)
def test_however_the_text_is_cut_the_thinking_and_the_answer_come_apart(
    thought: str, answer: str, data: st.DataObject
) -> None:
    expected = Split(thought, answer.lstrip("\n"))
    qwen_text = f"<think>{thought}</think>\n\n{answer}"
    assert streamed(QWEN3, chunked(qwen_text, data)) == streamed(QWEN3, [qwen_text]) == expected
    r1_text = f"{thought}</think>{answer}"
    assert streamed(R1, chunked(r1_text, data)) == streamed(R1, [r1_text]) == expected


def test_an_output_cut_short_while_thinking_is_all_reasoning() -> None:
    assert streamed(QWEN3, ["<think>Let me see"]) == Split("Let me see", "")
    assert streamed(R1, ["Let me see</thi"]) == Split("Let me see", "")
    assert streamed(QWEN3, ["<thi"]) == Split("", "")  # a tag cut short is neither part


def test_qwen3_without_thinking_is_all_answer() -> None:
    assert streamed(QWEN3, ["Four."]) == Split("", "Four.")
    assert streamed(QWEN3, ["<", "b>bold</b>"]) == Split("", "<b>bold</b>")
