"""Reasoning models: the thinking before the answer, kept out of the answer and out of its constraint.

The backend lets the model think freely and constrains only what follows the thinking
(:meth:`ReasoningFormat.after_thinking`), counts the thinking's tokens, and splits the text into
the thinking and the answer (:class:`ReasoningSplitter`), which go on the wire apart
(``reasoning_output`` and ``text_output``); the proxy sends them as ``reasoning_content`` and
``content``. The tags never reach either part, and the
answer's leading line breaks (the template's separation) are dropped. An output cut short while
thinking is all reasoning: its answer is empty, never the unconstrained thinking.

- ``deepseek_r1``: the generation prompt opens ``<think>``; the output starts inside the thinking,
  which ends at ``</think>``.
- ``qwen3``: the output may open with ``<think>`` and think until ``</think>``; the template can turn
  thinking off (``chat_template_kwargs: {"enable_thinking": false}``), and the output is then all answer.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llgtriton.guides import lark_text
from llgtriton.tags import partial_tag

THINK_START = "<think>"
THINK_END = "</think>"
TAGS = (THINK_START, THINK_END)  # the texts a tokenizer may have as special tokens (Qwen 3.5's do)


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    opened_by_prompt: bool  # the generation prompt opens the thinking: the output starts inside it

    def after_thinking(self, grammar: str, special: Mapping[str, int] | None = None) -> str:
        """``grammar`` (as :func:`llgtriton.guides.grammar_for` returns it) applied after the thinking,
        which is free text up to its end tag; under ``qwen3`` thinking is optional. ``special``: the
        tokenizer's special tokens among :data:`TAGS`, by their text."""
        special = special or {}
        inner = _grammars(grammar)
        opening = "" if self.opened_by_prompt else lark_text(THINK_START, special) + " "
        if THINK_END in special:  # no text holds the token: the thinking ends where it comes
            think = f"think: TEXT? {lark_text(THINK_END, special)}\nTEXT: /(.|\\n)+/"
        else:
            think = f"think[stop={json.dumps(THINK_END)}]: /(.|\\n)*/"
        thinking = f"({opening}think)?" if not self.opened_by_prompt else "think"
        top = f"start: {thinking} @answer\n{think}"
        return json.dumps({"grammars": [{"name": "thinking", "lark_grammar": top}, {**inner, "name": "answer"}]})


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek_r1": ReasoningFormat("deepseek_r1", opened_by_prompt=True),
    "qwen3": ReasoningFormat("qwen3", opened_by_prompt=False),
}


def detect_reasoning(template: str | None, generation_prompt: str) -> ReasoningFormat | None:
    """The reasoning format of a chat template that speaks of ``<think>``, by whether its generation
    prompt (``generation_prompt``, rendered) opens the thinking; None for other templates."""
    if not template or THINK_START not in template:
        return None
    opened = generation_prompt.rstrip().endswith(THINK_START)
    return REASONING_FORMATS["deepseek_r1" if opened else "qwen3"]


def thinks(form: ReasoningFormat | None, template_kwargs: dict[str, Any]) -> bool:
    """Whether a request's output begins with thinking: the template has a format and the request did
    not turn thinking off (only ``qwen3``-style templates can)."""
    if form is None:
        return False
    return form.opened_by_prompt or template_kwargs.get("enable_thinking", True) is not False


class _State(enum.Enum):
    OPENING = "opening"  # the output may yet open with the start tag
    THINKING = "thinking"
    ANSWERING = "answering"


@dataclass(frozen=True)
class Split:
    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    """Splits streamed text deltas into reasoning and answer, holding back what may be part of a tag."""

    def __init__(self, form: ReasoningFormat) -> None:
        self._state = _State.OPENING
        self._opened_by_prompt = form.opened_by_prompt
        self._held = ""
        self._answer_started = False

    @property
    def thinking(self) -> bool:
        """Whether the output is inside its thinking now."""
        return self._state is _State.THINKING

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


def _grammars(grammar: str) -> dict[str, Any]:
    """The one grammar of ``grammar``: llguidance's JSON of grammars, or Lark text."""
    if not grammar.lstrip().startswith("{"):
        return {"lark_grammar": grammar}
    grammars = json.loads(grammar).get("grammars") or []
    if len(grammars) != 1:  # its own references would no longer point where they did
        raise ValueError("a constraint of several grammars cannot follow the thinking")
    return dict(grammars[0])
