"""OutputStream: one request's tokens to responses; here, a reasoning model's thinking: its text apart from the
answer's, and its tokens counted."""

from __future__ import annotations

from typing import Any

import pytest

from backend.output_stream import OutputStream
from backend.requests import EngineRequest, SamplingParams
from llgtriton.reasoning import REASONING_FORMATS
from llgtriton.wire import FinishReason, GenerationOutput
from tests.support.harness import RecordingSink


def generate(
    tokenizer: Any, text: str, reasoning: str | None, max_tokens: int = 100, sink: RecordingSink | None = None
) -> tuple[GenerationOutput, int]:
    """Push ``text``'s tokens then EOS (unless max_tokens comes first): the final response, and the tokens
    pushed. With a ``sink``, the request streams its responses there."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    request = EngineRequest(
        "r",
        prompt_ids=(1,),
        max_tokens=max_tokens,
        sampling=SamplingParams(),
        stream=sink is not None,
        reasoning=REASONING_FORMATS[reasoning] if reasoning else None,
    )
    stream = OutputStream(request, sink or RecordingSink(), *OutputStream.parts(request, tokenizer))
    eos = tokenizer.eos_token_id
    for token in [*tokens, eos]:
        final = stream.push(token, {eos}, max_model_len=1000)
        if final is not None:
            return final, len(tokens)
    raise AssertionError("the stream did not end")


def tokens_through(tokenizer: Any, text: str, end: str) -> int:
    """How many of ``text``'s tokens it takes to have written ``end``."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    return next(n for n in range(1, len(tokens) + 1) if end in tokenizer.decode(tokens[:n]))


@pytest.mark.parametrize("reasoning", ["deepseek_r1", "qwen3"])
def test_the_thinking_tokens_are_those_up_to_its_end_tag(tokenizer: Any, reasoning: str) -> None:
    text = ("<think>" if reasoning == "qwen3" else "") + "Paris is in France, so</think>\n\nParis."
    final, total = generate(tokenizer, text, reasoning)
    assert final.reasoning_tokens == tokens_through(tokenizer, text, "</think>")
    assert 0 < final.reasoning_tokens < total == final.completion_tokens - 1  # (the EOS counts as generated)


def test_an_answer_without_thinking_has_none(tokenizer: Any) -> None:
    assert generate(tokenizer, "Paris.", "qwen3")[0].reasoning_tokens == 0
    assert generate(tokenizer, "<think>x</think>Paris.", None)[0].reasoning_tokens == 0  # no reasoning format


def test_thinking_cut_short_is_all_thinking(tokenizer: Any) -> None:
    final, _ = generate(tokenizer, "Let me think about it at length", "deepseek_r1", max_tokens=4)
    assert final.finish_reason is FinishReason.LENGTH
    assert final.reasoning_tokens == final.completion_tokens == 4


def test_ignore_eos_runs_past_end_tokens_to_max_tokens(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    hello = tokenizer.encode("Hello", add_special_tokens=False)[0]
    for ignore_eos, expected in ((False, (FinishReason.STOP, 2)), (True, (FinishReason.LENGTH, 5))):
        request = EngineRequest("r", prompt_ids=(1,), max_tokens=5, sampling=SamplingParams(), ignore_eos=ignore_eos)
        stream = OutputStream(request, RecordingSink(), *OutputStream.parts(request, tokenizer))
        finals = [stream.push(token, {eos}, max_model_len=1000) for token in [hello, eos, hello, eos, hello]]
        final = next(f for f in finals if f is not None)
        assert (final.finish_reason, final.completion_tokens) == expected
        assert final.text.count("Hello") == (3 if ignore_eos else 1)  # the end token writes no text


@pytest.mark.parametrize("reasoning", ["deepseek_r1", "qwen3"])
def test_the_thinking_and_the_answer_come_apart_without_their_tags(tokenizer: Any, reasoning: str) -> None:
    text = ("<think>" if reasoning == "qwen3" else "") + "Paris is in France, so</think>\n\nParis."
    final, _ = generate(tokenizer, text, reasoning)
    assert (final.reasoning, final.text) == ("Paris is in France, so", "Paris.")
    sink = RecordingSink()
    last, _ = generate(tokenizer, text, reasoning, sink=sink)
    streamed = [*sink.outputs, last]
    assert "".join(output.reasoning for output in streamed) == "Paris is in France, so"
    assert "".join(output.text for output in streamed) == "Paris."
    assert all("<" not in output.text + output.reasoning for output in streamed)


def test_a_model_that_does_not_think_answers_in_text_alone(tokenizer: Any) -> None:
    final, _ = generate(tokenizer, "<think>x</think>Paris.", None)
    assert (final.reasoning, final.text) == ("", "<think>x</think>Paris.")
    final, _ = generate(tokenizer, "Paris.", "qwen3")
    assert (final.reasoning, final.text) == ("", "Paris.")


def test_thinking_cut_short_is_all_reasoning_and_no_answer(tokenizer: Any) -> None:
    final, _ = generate(tokenizer, "Paris is in France, so the answer is Paris.", "deepseek_r1", max_tokens=4)
    assert final.finish_reason is FinishReason.LENGTH
    assert final.text == "" and final.reasoning
