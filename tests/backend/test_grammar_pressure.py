"""The grammar's pressure on a step: the mass its mask removed equals the softmax mass of the forbidden
tokens, and the first choice counts as forbidden exactly when the mask removed it."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.grammar_pressure import after_mask, before_mask
from backend.output_stream import PressureTally


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(2, 40), st.integers(0, 2**31 - 1))
def test_the_removed_mass_is_the_forbidden_tokens_probability(rows: int, vocab: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 4
    allowed = torch.rand(rows, vocab, generator=generator) < 0.5
    allowed[:, 0] = True  # a mask always allows something
    expected = (torch.softmax(logits, dim=-1) * ~allowed).sum(dim=-1)
    first_forbidden = ~allowed.gather(1, logits.argmax(dim=-1, keepdim=True)).squeeze(1)
    asked = list(range(rows))[::2] if rows > 1 else [0]

    unmasked = before_mask(logits, asked)
    logits.masked_fill_(~allowed, float("-inf"))  # as the mask kernel does, in place
    removed, forbidden = after_mask(logits, unmasked).tolist()

    assert all(math.isclose(r, e, abs_tol=1e-5) for r, e in zip(removed, expected[asked].tolist(), strict=True))
    assert forbidden == [float(flag) for flag in first_forbidden[asked].tolist()]


def test_a_tally_reports_the_mean_the_largest_and_the_forbidden_count() -> None:
    tally = PressureTally()
    for removed, forbidden in [(0.0, False), (0.5, True), (0.25, False)]:
        tally.add(removed, forbidden)
    report = tally.report()
    assert (report.tokens, report.mean_removed, report.max_removed, report.first_choice_forbidden) == (3, 0.25, 0.5, 1)
