"""Turns a batch of logits rows into tokens: penalties, temperature, top-k, top-p, seeded draws."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.requests import SamplingParams


def apply_logit_bias(logits: torch.Tensor, logit_bias: tuple[tuple[int, float], ...]) -> None:
    """OpenAI's logit_bias (token id, added value), in place on a 1-D row. A token a
    constraint masked stays at -inf: bias never lifts a mask."""
    if not logit_bias:
        return
    ids = torch.tensor([token for token, _ in logit_bias], dtype=torch.long, device=logits.device)
    bias = torch.tensor([value for _, value in logit_bias], dtype=logits.dtype, device=logits.device)
    logits.index_add_(-1, ids, bias)


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log probability of ``token`` under the softmax of the 1-D ``logits`` row as it is (masked,
    biased and penalised; before temperature, top-k and top-p), and the ``top`` most likely tokens
    with theirs. Masked tokens (-inf) are never among them."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    alternatives: list[tuple[int, float]] = []
    if top > 0:
        values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]))
        alternatives = [(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if v != float("-inf")]
    return float(logprobs[token]), alternatives


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
