"""The engine seam: what the scheduler needs from a model runner, nothing more."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class PromptScores:
    """Each prompt token after the first, scored given the tokens before it: its log probability and
    the ``top`` most likely tokens there, as (token id, log probability)."""

    logprobs: tuple[float, ...]
    alternatives: tuple[tuple[tuple[int, float], ...], ...]


class Engine(Protocol):
    """Runs forward passes for sequences the scheduler names by integer id.

    ``prefill`` processes new sequences' prompts (batched as the engine sees fit) and returns
    the logits of their next tokens as ``[len(seq_ids), vocab_size]`` rows in the same order;
    ``decode`` advances every named sequence by one token in a single forward pass and returns
    their next-token logits as ``[len(seq_ids), vocab_size]`` rows in the same order;
    ``release`` forgets a sequence (finished or cancelled); ``score_prompt`` runs a prompt on its
    own, outside any batch, to score its tokens (``echo`` with ``logprobs``).
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def stream_ptr(self) -> int: ...

    @property
    def decode_is_queued(self) -> bool:
        """True when ``decode`` returns once the forward pass is queued on the GPU (a graph replay), so
        host work done right after it overlaps the forward pass; False when it returns after doing
        most of the pass's host work (eager launches, or on CPU the pass itself)."""
        ...

    @property
    def device(self) -> torch.device: ...

    def prefill(self, seq_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor: ...

    def decode(self, seq_ids: Sequence[int], token_ids: Sequence[int]) -> torch.Tensor: ...

    def release(self, seq_id: int) -> None: ...

    def score_prompt(self, prompt: Sequence[int], top: int) -> PromptScores: ...


def current_stream_ptr(device: torch.device) -> int:
    """The handle of the stream torch queues work on for ``device`` (0 on CPU): the hooks' ``stream_ptr``."""
    if device.type == "cuda":
        return int(torch.cuda.current_stream(device).cuda_stream)
    return 0
