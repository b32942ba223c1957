"""How hard a grammar pushed a step's rows: the probability mass its mask removed from the model's own
distribution (temperature 1, before any bias or penalty), and whether it removed the model's first
choice.

This is the CPU path and the reference; on the GPU the mask applier computes the same in one read of
each row before the mask (``backend/kernels/grammar_pressure.cu``) and writes the figures into mapped
host memory. Either way the step loop reads them after the step's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepPressure:
    """A step's figures (:func:`pressure_of`, ``[len(rows), 2]``) and the step's rows they belong to,
    in that order: its constrained rows. From a GPU step the figures are in host memory that the
    step's stream writes: read them after the step's tokens, whose read-back waited for it."""

    rows: list[int]
    figures: torch.Tensor

    def values(self) -> list[list[float]]:
        """The figures, row by row."""
        return self.figures.cpu().numpy().tolist()  # type: ignore[no-any-return]  # (numpy's is faster)


def pressure_of(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``[rows, 2]`` float32 for unmasked ``[rows, V]`` logits and their ``allowed`` tokens: the mass the
    mask removes, and 1.0 where it removes the first choice (the lowest index of the largest logit)."""
    values = logits.float()
    kept_partition = torch.logsumexp(values.masked_fill(~allowed, float("-inf")), dim=-1)
    kept = torch.exp(kept_partition - torch.logsumexp(values, dim=-1))
    removed = torch.nan_to_num(1.0 - kept, nan=0.0).clamp(0.0, 1.0)  # (a row of only -inf removes nothing)
    top, first = values.max(dim=-1, keepdim=True)
    # (A row of only -inf has no first choice to forbid.)
    forbidden = ~allowed.gather(1, first).squeeze(1) & (top.squeeze(1) > float("-inf"))
    return torch.stack([removed, forbidden.float()], dim=1)
