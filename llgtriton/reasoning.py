"""Reasoning models: the thinking before the answer, kept out of the answer and out of its constraint.

Both sides share it. The backend lets the model think freely and constrains only what follows the
thinking (:meth:`ReasoningFormat.after_thinking`); the proxy splits the text into
``reasoning_content`` and ``content`` (:class:`ReasoningSplitter`), by the format the backend names
in its first response.

- ``deepseek_r1``: the generation prompt opens ``<think>``; the output starts inside the thinking,
  which ends at ``</think>``.
- ``qwen3``: the output may open with ``<think>`` and think until ``</think>``; the template can turn
  thinking off (``chat_template_kwargs: {"enable_thinking": false}``), and the output is then all answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llgtriton.guides import lark_text

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


def _grammars(grammar: str) -> dict[str, Any]:
    """The one grammar of ``grammar``: llguidance's JSON of grammars, or Lark text."""
    if not grammar.lstrip().startswith("{"):
        return {"lark_grammar": grammar}
    grammars = json.loads(grammar).get("grammars") or []
    if len(grammars) != 1:  # its own references would no longer point where they did
        raise ValueError("a constraint of several grammars cannot follow the thinking")
    return dict(grammars[0])
