"""What crosses the pipe from the engine core to the stub: every output arrives whole, whether it
travels as a plain tuple (text, finish reason and counts only) or as a whole reply."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from backend.core_server import Reply, reply_from_wire, reply_to_wire
from llgtriton.token_logprobs import PromptLogprobs, TokenLogprob
from llgtriton.wire import FinishReason, GenerationOutput, GrammarPressure

PLAIN = GenerationOutput(" token", None, 12, 3)
# One output for each field beyond text, finish reason and counts, that field set.
WITH_EXTRAS = {
    "logprobs": dataclasses.replace(PLAIN, logprobs=(TokenLogprob(b" token", -0.25),)),
    "prompt_logprobs": dataclasses.replace(PLAIN, prompt_logprobs=PromptLogprobs(b"a", (TokenLogprob(b" b", -1.0),))),
    "tool_call_format": dataclasses.replace(PLAIN, tool_call_format="hermes"),
    "reasoning_format": dataclasses.replace(PLAIN, reasoning_format="deepseek_r1"),
    "reasoning_tokens": dataclasses.replace(PLAIN, reasoning_tokens=2),
    "reasoning": dataclasses.replace(PLAIN, reasoning="hmm"),
    "grammar_pressure": dataclasses.replace(PLAIN, grammar_pressure=GrammarPressure(3, 0.1, 0.5, 1)),
}


def across_the_pipe(key: int, output: GenerationOutput, final: bool) -> Reply:
    return reply_from_wire(pickle.loads(pickle.dumps(reply_to_wire(key, output, final))))


@pytest.mark.parametrize("finish", [None, *FinishReason])
@pytest.mark.parametrize("final", [False, True])
def test_a_plain_output_arrives_whole(finish: FinishReason | None, final: bool) -> None:
    output = dataclasses.replace(PLAIN, text="é\n{", finish_reason=finish)
    assert across_the_pipe(7, output, final) == Reply(7, output, final)


@pytest.mark.parametrize("field", sorted(WITH_EXTRAS))
def test_an_output_with_more_than_text_and_counts_arrives_whole(field: str) -> None:
    output = WITH_EXTRAS[field]
    assert across_the_pipe(9, output, True) == Reply(9, output, True)


def test_every_field_of_an_output_is_covered_above() -> None:
    plain = {"text", "finish_reason", "prompt_tokens", "completion_tokens"}
    assert {field.name for field in dataclasses.fields(GenerationOutput)} == plain | set(WITH_EXTRAS)
