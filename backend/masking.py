"""Applying llguidance token bitmasks to logits: the CPU path, and the reference the GPU kernel must match.

A bitmask row is int32 ``[ceil(V / 32)]``; token ``t`` is allowed when bit ``t & 31`` of word
``t >> 5`` is set. Disallowed logits become ``-inf``; columns past the mask are disallowed.
"""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Boolean ``[..., vocab_size]`` view of a bitmask ``[..., words]``."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    allowed = bits.flatten(-2).bool()
    width = allowed.shape[-1]
    if width >= vocab_size:
        return allowed[..., :vocab_size]
    padding = torch.zeros((*allowed.shape[:-1], vocab_size - width), dtype=torch.bool, device=allowed.device)
    return torch.cat([allowed, padding], dim=-1)


def apply_token_bitmask_cpu(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set the logits of disallowed tokens to -inf, in place; ``logits`` is ``[..., V]``."""
    allowed = allowed_tokens(bitmask, logits.shape[-1])
    logits.masked_fill_(~allowed, float("-inf"))
