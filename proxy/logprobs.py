"""The backend's token logprobs in OpenAI's two shapes: chat's ``content`` list and completions' columns.

The backend reports log probabilities from the logits as the constraint, ``logit_bias`` and the
penalties left them, before temperature, top-k and top-p: under a constraint, the model's
distribution over the tokens the grammar allows. A token's text is its bytes decoded as UTF-8
(a token holding part of a character shows U+FFFD; ``bytes`` is exact).
"""

from __future__ import annotations

from collections.abc import Sequence

from llgtriton import wire
from proxy.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def chat_logprobs(entries: Sequence[wire.TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=_text(entry.token),
                logprob=entry.logprob,
                bytes=list(entry.token),
                top_logprobs=[
                    TopLogprob(token=_text(a.token), logprob=a.logprob, bytes=list(a.token)) for a in entry.top
                ],
            )
            for entry in entries
        ]
    )


def completion_logprobs(
    entries: Sequence[wire.TokenLogprob], top: int, offset: int, prompt: wire.PromptLogprobs | None = None
) -> CompletionLogprobs:
    """Columns for ``entries``, after the echoed ``prompt``'s when given (its first token unscored);
    ``offset`` is where their text starts in the choice's text."""
    tokens = [_text(entry.token) for entry in entries]
    token_logprobs: list[float | None] = [entry.logprob for entry in entries]
    tops: list[dict[str, float] | None] = [{_text(a.token): a.logprob for a in entry.top} for entry in entries]
    if prompt is not None:
        scored = prompt.rest
        tokens = [_text(prompt.first), *(_text(entry.token) for entry in scored), *tokens]
        token_logprobs = [None, *(entry.logprob for entry in scored), *token_logprobs]
        tops = [None, *({_text(a.token): a.logprob for a in entry.top} for entry in scored), *tops]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=token_logprobs, top_logprobs=tops if top else None, text_offset=offsets
    )
