"""The responses of the Triton contract: what one response of a generation carries, and its tensors.

Part of :mod:`llgtriton.wire`, which exports every name here.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

import numpy as np

from llgtriton.tensor_values import Array, TensorGetter, ValuesGetter, flat, scalar, single, text_of
from llgtriton.token_logprobs import (
    PromptLogprobs,
    TokenLogprob,
    logprobs_from_json,
    logprobs_json,
    prompt_logprobs_from_json,
    prompt_logprobs_json,
)
from llgtriton.wire_errors import WireError

# Outputs ------------------------------------------------------------------------------------
TEXT_OUTPUT = "text_output"  # the answer: a reasoning model's thinking, and its tags, are left out
REASONING_OUTPUT = "reasoning_output"  # a reasoning model's thinking, without its tags (absent when none)
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
NUM_REASONING_TOKENS = "num_reasoning_tokens"  # of the output tokens, those the model thought in
TOKEN_LOGPROBS = "token_logprobs"  # JSON list, one entry per token of this response (absent when not asked)
PROMPT_LOGPROBS = "prompt_logprobs"  # JSON object, on a request's first response (absent otherwise)
TOOL_CALL_FORMAT = "tool_call_format"  # the family calls are written in, on the first response of a request with tools
REASONING_FORMAT = "reasoning_format"  # how the output's thinking is marked, on the first response of one that thinks

GRAMMAR_PRESSURE = "grammar_pressure"  # JSON GrammarPressure, on the final response of a request that asked

# Triton data types of every output, as written in config.pbtxt (TYPE_<name>); the inputs' are
# in REQUEST_FIELDS (INPUT_TYPES).
OUTPUT_TYPES: dict[str, str] = {
    TEXT_OUTPUT: "STRING",
    REASONING_OUTPUT: "STRING",
    FINISH_REASON: "STRING",
    NUM_INPUT_TOKENS: "INT32",
    NUM_OUTPUT_TOKENS: "INT32",
    NUM_REASONING_TOKENS: "INT32",
    TOKEN_LOGPROBS: "STRING",
    PROMPT_LOGPROBS: "STRING",
    TOOL_CALL_FORMAT: "STRING",
    REASONING_FORMAT: "STRING",
    GRAMMAR_PRESSURE: "STRING",
}


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"


@dataclass(frozen=True)
class GrammarPressure:
    """How hard a constraint pushed one output: over its ``tokens``, the mean and the largest
    probability mass (of the model's own distribution) that the grammar's mask removed, and how
    many times the model's first choice was a token the grammar forbade."""

    tokens: int
    mean_removed: float
    max_removed: float
    first_choice_forbidden: int

    def to_json(self) -> str:
        return json.dumps(
            [self.tokens, self.mean_removed, self.max_removed, self.first_choice_forbidden], separators=(",", ":")
        )

    @classmethod
    def from_json(cls, payload: str) -> GrammarPressure | None:
        if not payload:
            return None
        try:
            tokens, mean, largest, forbidden = json.loads(payload)
            return cls(int(tokens), float(mean), float(largest), int(forbidden))
        except (ValueError, TypeError) as exc:
            raise WireError(f"{GRAMMAR_PRESSURE} is not [tokens, mean, max, forbidden]: {exc}") from None


@dataclass(frozen=True)
class GenerationOutput:
    """One response of a generation: a text delta (streaming) or the whole text."""

    text: str  # the answer's text
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The tokens this response covers, when the request asked for logprobs (None otherwise).
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # on the first response, when the request asked
    tool_call_format: str = ""  # on the first response of a request with tools (tool_formats.FORMATS)
    reasoning_format: str = ""  # on the first response of an output that thinks (reasoning.REASONING_FORMATS)
    reasoning_tokens: int = 0  # of completion_tokens, those of the thinking (a reasoning model's)
    reasoning: str = ""  # the thinking's text, apart from the answer's (a reasoning model's)
    grammar_pressure: GrammarPressure | None = None  # on the final response, when the request asked


def _scalar(name: str, value: object) -> Array:
    return scalar(name, OUTPUT_TYPES[name], value)


def encode_output(output: GenerationOutput) -> dict[str, Array]:
    """A response's tensors: the text, finish reason and token counts always; the optional outputs only
    where they carry something (each tensor costs the python stub a shared-memory copy per response,
    and the decoder reads a missing one as its default)."""
    reason = output.finish_reason.value if output.finish_reason is not None else ""
    tensors = {
        TEXT_OUTPUT: np.array([[output.text.encode("utf-8")]], dtype=np.object_),
        FINISH_REASON: _scalar(FINISH_REASON, reason),
        NUM_INPUT_TOKENS: _scalar(NUM_INPUT_TOKENS, output.prompt_tokens),
        NUM_OUTPUT_TOKENS: _scalar(NUM_OUTPUT_TOKENS, output.completion_tokens),
    }
    if output.reasoning:
        tensors[REASONING_OUTPUT] = _scalar(REASONING_OUTPUT, output.reasoning)
    if output.reasoning_tokens:
        tensors[NUM_REASONING_TOKENS] = _scalar(NUM_REASONING_TOKENS, output.reasoning_tokens)
    if output.logprobs is not None:
        tensors[TOKEN_LOGPROBS] = _scalar(TOKEN_LOGPROBS, logprobs_json(output.logprobs))
    if output.prompt_logprobs is not None:
        tensors[PROMPT_LOGPROBS] = _scalar(PROMPT_LOGPROBS, prompt_logprobs_json(output.prompt_logprobs))
    if output.tool_call_format:
        tensors[TOOL_CALL_FORMAT] = _scalar(TOOL_CALL_FORMAT, output.tool_call_format)
    if output.reasoning_format:
        tensors[REASONING_FORMAT] = _scalar(REASONING_FORMAT, output.reasoning_format)
    if output.grammar_pressure is not None:
        tensors[GRAMMAR_PRESSURE] = _scalar(GRAMMAR_PRESSURE, output.grammar_pressure.to_json())
    return tensors


def _joined_text(values: ValuesGetter, name: str) -> str:
    """A text output's elements joined ("" when it is absent)."""
    found = values(name)
    return "" if found is None else "".join(text_of(value, name) for value in found)


def decode_output(get: TensorGetter) -> GenerationOutput:
    return decode_output_values(flat(get))


def decode_output_values(values: ValuesGetter) -> GenerationOutput:
    """A response from the flat values of its tensors (BYTES as ``bytes``, INT32 as ``int``).

    The proxy reads them straight from the gRPC message, with no numpy arrays per streamed chunk.
    """
    text, reasoning = _joined_text(values, TEXT_OUTPUT), _joined_text(values, REASONING_OUTPUT)
    reason_value = single(values, FINISH_REASON)
    reason = text_of(reason_value, FINISH_REASON) if reason_value is not None else ""
    prompt_tokens, completion_tokens = single(values, NUM_INPUT_TOKENS), single(values, NUM_OUTPUT_TOKENS)
    return GenerationOutput(
        text=text,
        finish_reason=FinishReason(reason) if reason else None,
        prompt_tokens=int(prompt_tokens or 0),  # type: ignore[call-overload]
        completion_tokens=int(completion_tokens or 0),  # type: ignore[call-overload]
        reasoning_tokens=int(single(values, NUM_REASONING_TOKENS) or 0),  # type: ignore[call-overload]
        reasoning=reasoning,
        logprobs=logprobs_from_json(text_of(single(values, TOKEN_LOGPROBS) or b"", TOKEN_LOGPROBS), TOKEN_LOGPROBS),
        prompt_logprobs=prompt_logprobs_from_json(
            text_of(single(values, PROMPT_LOGPROBS) or b"", PROMPT_LOGPROBS), PROMPT_LOGPROBS
        ),
        tool_call_format=text_of(single(values, TOOL_CALL_FORMAT) or b"", TOOL_CALL_FORMAT),
        reasoning_format=text_of(single(values, REASONING_FORMAT) or b"", REASONING_FORMAT),
        grammar_pressure=GrammarPressure.from_json(text_of(single(values, GRAMMAR_PRESSURE) or b"", GRAMMAR_PRESSURE)),
    )
