"""One request's tokens turned into responses: detokenized, stop strings cut, ended by EOS or length,
and a reasoning model's thinking sent apart from its answer.

Shared by every engine: the torch step loop and the TensorRT-LLM adapter push sampled tokens
one at a time and get the final response back when the request is over, to send once they have
released its resources.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from backend.contract import ResponseSink, deliver
from backend.detokenizer import Decoder, IncrementalDetokenizer
from backend.output_grammar import OutputGrammar
from backend.requests import EngineRequest
from backend.stop_strings import StopStringFilter
from llgtriton.reasoning import ReasoningSplitter, Split
from llgtriton.wire import FinishReason, GenerationOutput, GrammarPressure, PromptLogprobs, TokenLogprob

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PressureTally:
    """The grammar's pressure on one output, step by step: the mass each mask removed, and whether it
    removed the model's first choice. A step the grammar did not mask removed nothing.

    The step loop adds every asking request's row each step, so an add only extends one flat list of
    floats (no object per step for the garbage collector to walk); it is summed once, at the end."""

    figures: list[float] = field(default_factory=list)  # removed mass, first choice forbidden, ...

    def add(self, figures: Sequence[float]) -> None:
        """One step: the mass removed, and 1.0 where the first choice was forbidden."""
        self.figures.extend(figures)

    def report(self) -> GrammarPressure:
        removed = self.figures[0::2]
        if not removed:
            return GrammarPressure(0, 0.0, 0.0, 0)
        forbidden = sum(1 for flag in self.figures[1::2] if flag)
        return GrammarPressure(len(removed), sum(removed) / len(removed), max(removed), forbidden)


@dataclass(eq=False)
class OutputStream:
    request: EngineRequest
    sink: ResponseSink
    detokenizer: IncrementalDetokenizer
    stop_filter: StopStringFilter
    generated: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # emitted text, thinking and all: what the grammar reads
    answer: list[str] = field(default_factory=list)  # of an output that thinks: its answer's emitted text
    thought: list[str] = field(default_factory=list)  # and its thinking's
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of tokens not sent yet
    prompt_logprobs: PromptLogprobs | None = None  # not sent yet: they go with the first response
    reasoning_tokens: int = 0  # of the generated tokens, those of the thinking
    thinking: ReasoningSplitter | None = None  # follows the thinking token by token, to count its tokens
    splitter: ReasoningSplitter | None = None  # splits the emitted text into thinking and answer
    grammar: OutputGrammar | None = None  # where a constrained output may end
    pressure: PressureTally | None = None  # how hard the grammar pushed, when the request asked

    def __post_init__(self) -> None:
        if self.request.grammar_pressure:
            self.pressure = PressureTally()
        if self.grammar is not None:
            grammar = self.grammar
            self.stop_filter.may_stop = lambda before: grammar.completes("".join(self.text) + before)

    @staticmethod
    def parts(request: EngineRequest, decoder: Decoder) -> tuple[IncrementalDetokenizer, StopStringFilter]:
        """The detokenizer and stop filter a new stream for ``request`` starts with."""
        detokenizer = IncrementalDetokenizer(decoder, request.prompt_ids, request.kept_tokens)
        return detokenizer, StopStringFilter(request.stop)

    def output(self, text: str, finish_reason: FinishReason | None = None, reasoning: str = "") -> GenerationOutput:
        """The next response; it carries the logprobs of every token since the last one."""
        logprobs = None
        if self.request.logprobs is not None:
            logprobs, self.logprobs = tuple(self.logprobs), []
        prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None
        return GenerationOutput(
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=len(self.generated),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            reasoning_tokens=self.reasoning_tokens,
            reasoning=reasoning,
            grammar_pressure=self.pressure.report() if self.pressure is not None and finish_reason else None,
        )

    def push(self, token: int, eos: Collection[int], max_model_len: int) -> GenerationOutput | None:
        """Take the next sampled token; stream its text. Returns the final response once the request is over.

        Raises :class:`~backend.output_grammar.IncompleteOutput` for an end token where the output's
        grammar is incomplete: the request then fails, never answering ``stop`` for broken output."""
        self.generated.append(token)
        if self.is_end_token(token, eos):
            if self.grammar is not None:
                self.grammar.check_complete()
            return self.final(FinishReason.STOP, self.drain())
        piece = self.detokenizer.push(token)
        self._count_thinking(piece)
        text, stopped = self.stop_filter.push(piece)
        if stopped:
            return self.final(FinishReason.STOP, text)
        if self._at_limit(max_model_len):
            return self.final(FinishReason.LENGTH, text + self.drain())
        if text:
            self.text.append(text)
            answer, thought = self._parts(text)
            if self.request.stream and (answer or thought):
                deliver(self.sink, self.output(answer, reasoning=thought), final=False)
        return None

    def _parts(self, text: str, *, last: bool = False) -> tuple[str, str]:
        """Newly emitted ``text`` as (answer, thinking), kept for a whole response; ``last`` also
        releases what the splitter held back as a possible tag. A model that does not think answers
        in ``text`` alone, which :attr:`text` already keeps (nothing more per token on that path)."""
        if self.request.reasoning is None:
            return text, ""
        if self.splitter is None:
            self.splitter = ReasoningSplitter(self.request.reasoning)
        split = self.splitter.feed(text)
        if last:
            rest = self.splitter.finish()
            split = Split(split.reasoning + rest.reasoning, split.content + rest.content)
        self.answer.append(split.content)
        self.thought.append(split.reasoning)
        return split.content, split.reasoning

    def _count_thinking(self, text: str) -> None:
        """Every token up to the one that completes the thinking's end tag is the thinking's."""
        if self.request.reasoning is None:
            return
        if self.thinking is None:
            self.thinking = ReasoningSplitter(self.request.reasoning)
        was_thinking = self.thinking.thinking
        self.thinking.feed(text)
        if was_thinking or self.thinking.thinking:
            self.reasoning_tokens = len(self.generated)

    def ends_on(self, token: int, eos: Collection[int], max_model_len: int) -> bool:
        """Whether :meth:`push` of ``token`` will end the request whatever its text: an end token,
        or the length or context limit it reaches."""
        return self.is_end_token(token, eos) or self._at_limit(max_model_len, ahead=1)

    def is_end_token(self, token: int, eos: Collection[int]) -> bool:
        return token in eos and not self.request.ignore_eos

    def _at_limit(self, max_model_len: int, *, ahead: int = 0) -> bool:
        """``max_tokens`` or the context reached, with ``ahead`` more tokens generated."""
        generated = len(self.generated) + ahead
        return generated >= self.request.max_tokens or len(self.request.prompt_ids) + generated >= max_model_len

    def drain(self) -> str:
        """Text still held by the detokenizer and the stop filter, at the end of generation."""
        text, stopped = self.stop_filter.push(self.detokenizer.flush())
        return text if stopped else text + self.stop_filter.flush()

    def final(self, reason: FinishReason, tail: str) -> GenerationOutput:
        answer, thought = self._parts(tail, last=True)
        if self.request.stream:
            return self.output(answer, reason, reasoning=thought)
        if self.request.reasoning is None:
            return self.output("".join(self.text) + tail, reason)
        return self.output("".join(self.answer), reason, reasoning="".join(self.thought))
