"""Where a constrained output may end: only where its grammar accepts the output as complete.

An end token is allowed by the mask only there, so an output that ends on one is complete; the
check here makes that a rule rather than a property of the mask. A stop string is text the grammar
knows nothing of: it ends a constrained output only where the text before it is a complete output
by the grammar (free text before a call, a JSON answer just closed), and elsewhere it is text like
any other. Without that, a stop string inside a JSON string would cut the JSON and answer ``stop``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from llguidance import LLMatcher, LLTokenizer

from backend.errors import BackendError

# Each stop string the grammar refuses costs a pass over the output so far: a request gets this many.
MAX_STOP_CHECKS = 16


class IncompleteOutput(BackendError):
    """The output ended where its grammar did not accept it (never expected: the mask prevents it)."""


class OutputGrammar:
    """One constrained request's grammar, as its output stream asks it where the output may end.

    ``accepting``: whether the tokens generated so far (all but the newest) form a complete output;
    ``pristine``: a copy of the request's matcher before any output, for texts the output may end
    on (None when the request has no stop strings); ``tags``: the special tokens the output's text
    spells out (tool-call tags), which the grammar names as tokens.
    """

    def __init__(
        self,
        accepting: Callable[[], bool],
        pristine: LLMatcher | None,
        tokenizer: LLTokenizer,
        tags: Mapping[str, int],
    ) -> None:
        self._accepting = accepting
        self._pristine = pristine
        self._tokenizer = tokenizer
        self._tags = dict(tags)
        spellings = "|".join(map(re.escape, sorted(tags, key=len, reverse=True)))
        self._split = re.compile(f"({spellings})") if tags else None
        self._checks = 0

    def complete(self) -> bool:
        return self._accepting()

    def check_complete(self) -> None:
        if not self._accepting():
            raise IncompleteOutput("the output ended before its constraint was complete")

    def completes(self, text: str) -> bool:
        """Whether ``text`` is a complete output; False past :data:`MAX_STOP_CHECKS` refusals."""
        if self._pristine is None or self._checks >= MAX_STOP_CHECKS:
            return False
        matcher = self._pristine.deep_copy()
        tokens = self._tokens(text)
        if matcher.consume_tokens(tokens) and matcher.is_accepting():
            return True
        self._checks += 1
        return False

    def _tokens(self, text: str) -> list[int]:
        parts = self._split.split(text) if self._split is not None else [text]
        tokens: list[int] = []
        for part in parts:
            if part in self._tags:
                tokens.append(self._tags[part])
            elif part:
                tokens.extend(self._tokenizer.tokenize_str(part))
        return tokens
