"""How hard a grammar pushed a step's rows: the probability mass its mask removed from the model's own
distribution (temperature 1, before any bias or penalty), and whether it removed the model's first
choice. Reductions over the rows that asked, on the logits' device, read back with the step's tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Unmasked:
    """What the rows' logits said before the mask: their log-partition and their first choice."""

    rows: torch.Tensor | None  # which rows of the step (None: all of them)
    log_partition: torch.Tensor
    first_choice: torch.Tensor


def before_mask(logits: torch.Tensor, rows: list[int]) -> Unmasked:
    index = None if len(rows) == logits.shape[0] else torch.tensor(rows, device=logits.device)
    picked = (logits if index is None else logits.index_select(0, index)).float()
    return Unmasked(index, torch.logsumexp(picked, dim=-1), picked.argmax(dim=-1))


def after_mask(logits: torch.Tensor, unmasked: Unmasked) -> torch.Tensor:
    """``[2, rows]``: the mass each row's mask removed, and 1.0 where it removed the first choice."""
    picked = (logits if unmasked.rows is None else logits.index_select(0, unmasked.rows)).float()
    kept = torch.exp(torch.logsumexp(picked, dim=-1) - unmasked.log_partition)
    forbidden = picked.gather(1, unmasked.first_choice[:, None]).squeeze(1) == float("-inf")
    return torch.stack([(1.0 - kept).clamp(0.0, 1.0), forbidden.float()])
