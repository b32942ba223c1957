"""Splitting a reasoning model's output into its thinking (``reasoning_content``) and its answer.

The backend names the format in its first response (``llgtriton.reasoning``). The tags never reach
either part, and the answer's leading line breaks (the template's separation) are dropped. An output
cut short while thinking is all reasoning: its answer is empty, never the unconstrained thinking.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llgtriton.reasoning import REASONING_FORMATS, THINK_END, THINK_START, ReasoningFormat
from proxy.errors import InternalError
from proxy.tags import partial_tag


class _State(enum.Enum):
    OPENING = "opening"  # the output may yet open with the start tag
    THINKING = "thinking"
    ANSWERING = "answering"


@dataclass(frozen=True)
class Split:
    reasoning: str = ""
    content: str = ""


def reasoning_format(name: str) -> ReasoningFormat | None:
    """The format a backend says the output's thinking is in; None when it says none."""
    if not name:
        return None
    form = REASONING_FORMATS.get(name)
    if form is None:
        raise InternalError(f"the backend wrote reasoning in an unknown format {name!r}")
    return form


class ReasoningSplitter:
    """Splits streamed text deltas into reasoning and answer, holding back what may be part of a tag."""

    def __init__(self, form: ReasoningFormat) -> None:
        self._state = _State.OPENING
        self._opened_by_prompt = form.opened_by_prompt
        self._held = ""
        self._answer_started = False

    def feed(self, text: str) -> Split:
        self._held += text
        reasoning = content = ""
        if self._state is _State.OPENING:
            stripped = self._held.lstrip()
            if stripped.startswith(THINK_START):
                self._state, self._held = _State.THINKING, stripped[len(THINK_START) :]
            elif stripped and not THINK_START.startswith(stripped):  # no start tag after all
                self._state = _State.THINKING if self._opened_by_prompt else _State.ANSWERING
            else:
                return Split()
        if self._state is _State.THINKING:
            end = self._held.find(THINK_END)
            if end < 0:
                keep = partial_tag(self._held, THINK_END)
                reasoning, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
                return Split(reasoning=reasoning)
            reasoning, self._held = self._held[:end], self._held[end + len(THINK_END) :]
            self._state = _State.ANSWERING
        content, self._held = self._held, ""
        if not self._answer_started:
            content = content.lstrip("\n")
            self._answer_started = bool(content)
        return Split(reasoning, content)

    def finish(self) -> Split:
        """What is still held when the generation ends: thinking cut short stays reasoning, and a tag
        cut short is neither part."""
        held, self._held = self._held, ""
        if self._state is _State.THINKING and not THINK_END.startswith(held):
            return Split(reasoning=held)
        return Split()


def split_reasoning(form: ReasoningFormat | None, text: str) -> Split:
    """A finished output's reasoning and answer (all answer without a format)."""
    if form is None:
        return Split(content=text)
    splitter = ReasoningSplitter(form)
    first, last = splitter.feed(text), splitter.finish()
    return Split(first.reasoning + last.reasoning, first.content + last.content)
