"""The grammar's pressure on a step: the mass its mask removed equals the softmax mass of the forbidden
tokens, and the first choice counts as forbidden exactly when the mask removed it; the mask applier
reports it for the rows it masks, as it finds them before the mask."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.grammar_pressure import pressure_of
from backend.masking import CpuBitmaskApplier
from backend.output_stream import PressureTally


def random_step(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and allowed tokens (each row allows something)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 4
    allowed = torch.rand(rows, vocab, generator=generator) < 0.5
    allowed[:, 0] = True
    return logits, allowed


def as_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    words = (allowed.shape[1] + 31) // 32
    padded = torch.zeros((allowed.shape[0], words * 32), dtype=torch.int64)
    padded[:, : allowed.shape[1]] = allowed.long()
    weights = torch.tensor([1 << bit for bit in range(32)], dtype=torch.int64)
    packed = (padded.view(allowed.shape[0], words, 32) * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(2, 40), st.integers(0, 2**31 - 1))
def test_the_removed_mass_is_the_forbidden_tokens_probability(rows: int, vocab: int, seed: int) -> None:
    logits, allowed = random_step(rows, vocab, seed)
    expected = (torch.softmax(logits, dim=-1) * ~allowed).sum(dim=-1)
    first_forbidden = ~allowed.gather(1, logits.argmax(dim=-1, keepdim=True)).squeeze(1)

    removed, forbidden = pressure_of(logits, allowed).T.tolist()

    assert all(math.isclose(r, e, abs_tol=1e-5) for r, e in zip(removed, expected.tolist(), strict=True))
    assert forbidden == [float(flag) for flag in first_forbidden.tolist()]


def test_a_row_of_only_minus_infinity_removes_nothing() -> None:
    logits = torch.full((1, 8), float("-inf"))
    allowed = torch.zeros((1, 8), dtype=torch.bool)
    assert pressure_of(logits, allowed).tolist() == [[0.0, 0.0]]  # and it has no first choice to forbid


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(2, 80), st.integers(0, 2**31 - 1))
def test_the_applier_reports_the_pressure_its_masks_exert(rows: int, vocab: int, seed: int) -> None:
    logits, allowed = random_step(rows, vocab, seed)
    chosen = list(range(rows))[::-2]  # some rows, out of order
    expected = pressure_of(logits[chosen], allowed[chosen])
    applier = CpuBitmaskApplier(vocab, rows)
    applier.host_masks(len(chosen)).copy_(as_bitmask(allowed[chosen]))

    masked = logits.clone()
    reported = applier.apply(masked, 0, rows=chosen, report_pressure=True)

    assert reported is not None and torch.allclose(reported, expected)
    assert torch.equal(masked[chosen].isinf(), ~allowed[chosen])  # and it masked them


def test_a_tally_reports_the_mean_the_largest_and_the_forbidden_count() -> None:
    tally = PressureTally()
    for figures in [(0.0, 0.0), (0.5, 1.0), (0.25, 0.0)]:
        tally.add(figures)
    report = tally.report()
    assert (report.tokens, report.mean_removed, report.max_removed, report.first_choice_forbidden) == (3, 0.25, 0.5, 1)
