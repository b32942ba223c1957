"""Turns a batch of logits rows into tokens: penalties, temperature, top-k, top-p, seeded draws."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.requests import SamplingParams


def apply_penalties(logits: torch.Tensor, generated: Sequence[int], params: SamplingParams) -> None:
    """OpenAI's presence and frequency penalties over the tokens generated so far, in place."""
    if not params.penalised or not generated:
        return
    ids = torch.tensor(generated, dtype=torch.long, device=logits.device)
    counts = torch.bincount(ids, minlength=logits.shape[-1]).to(logits.dtype)
    logits -= counts * params.frequency_penalty + (counts > 0).to(logits.dtype) * params.presence_penalty


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits`` (1-D) with everything outside the top-k and the top-p nucleus set to -inf."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        threshold = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the tokens ranked above it already reach top_p; always keep the first.
        drop = torch.cumsum(probs, dim=-1) - probs >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def greedy_tokens(rows: Sequence[torch.Tensor]) -> list[int]:
    """The argmax of every 1-D logits row, with one device round trip for all of them."""
    if len(rows) == 1:
        return [int(torch.argmax(rows[0]))]
    return [int(t) for t in torch.stack(list(rows)).argmax(dim=-1).tolist()]


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from a 1-D logits row (already masked and penalised)."""
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = _filter_top_k_top_p(logits.float() / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None, device: torch.device | None = None) -> torch.Generator:
    """A request's own random stream, on the device its logits live on."""
    generator = torch.Generator(device=device or torch.device("cpu"))
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
