"""Sampling: greedy, top-k, top-p, seeded draws and OpenAI's presence/frequency penalties."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.requests import SamplingParams
from backend.sampling import apply_penalties, make_generator, sample_token

PROPERTY = settings(deadline=None, max_examples=60)

# Logits with a unique maximum, so that "the argmax" is one token.
logit_rows = st.lists(st.floats(-50, 50, width=32), min_size=2, max_size=40, unique=True)


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _draws(logits: torch.Tensor, params: SamplingParams, count: int, seed: int = 0) -> list[int]:
    generator = make_generator(seed)
    return [sample_token(logits, params, generator) for _ in range(count)]


@PROPERTY
@given(logit_rows, st.integers(0, 2**32))
def test_temperature_zero_is_greedy(values: list[float], seed: int) -> None:
    logits = _row(values)
    argmax = values.index(max(values))
    # Greedy ignores top-k / top-p and the seed.
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, top_k=3, top_p=0.5)):
        assert _draws(logits, params, 3, seed) == [argmax] * 3


@PROPERTY
@given(logit_rows, st.integers(0, 2**32))
def test_top_k_one_always_draws_the_argmax(values: list[float], seed: int) -> None:
    argmax = values.index(max(values))
    assert _draws(_row(values), SamplingParams(temperature=1.0, top_k=1), 20, seed) == [argmax] * 20


@PROPERTY
@given(logit_rows, st.integers(0, 2**32))
def test_tiny_top_p_always_draws_the_argmax(values: list[float], seed: int) -> None:
    argmax = values.index(max(values))
    assert _draws(_row(values), SamplingParams(temperature=1.0, top_p=1e-6), 20, seed) == [argmax] * 20


def test_flat_distribution_is_actually_sampled() -> None:
    # Not greedy at temperature 1: a flat distribution over 8 tokens reaches every token.
    assert set(_draws(torch.zeros(8), SamplingParams(), 400)) == set(range(8))


def test_tokens_outside_top_k_are_never_drawn() -> None:
    logits = torch.arange(10, dtype=torch.float32) / 4  # token 9 most likely, token 0 least
    draws = _draws(logits, SamplingParams(temperature=2.0, top_k=3), 2000)
    assert set(draws) == {7, 8, 9}


def test_tokens_outside_the_top_p_nucleus_are_never_drawn() -> None:
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    # Nucleus for top_p=0.7: 0.5 (cumulative 0.5 < 0.7, keep going) then 0.3 (reaches 0.8) -> {1, 3}.
    draws = _draws(torch.log(probs), SamplingParams(top_p=0.7), 2000)
    assert set(draws) == {1, 3}


def test_top_k_and_top_p_combine() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    draws = _draws(torch.log(probs), SamplingParams(top_k=3, top_p=0.95), 2000)
    assert set(draws) == {0, 1, 2}


def test_top_k_larger_than_the_vocabulary_keeps_everything() -> None:
    assert set(_draws(torch.zeros(4), SamplingParams(top_k=100), 400)) == {0, 1, 2, 3}


def test_same_seed_gives_the_same_sequence() -> None:
    logits = torch.zeros(1000)
    for seed in (0, 42, 2**63, 2**64 - 1):
        assert _draws(logits, SamplingParams(), 50, seed) == _draws(logits, SamplingParams(), 50, seed)


def test_different_seeds_give_different_sequences() -> None:
    logits = torch.zeros(1000)
    sequences = {tuple(_draws(logits, SamplingParams(), 50, seed)) for seed in (1, 2, 3, 2**64 - 1)}
    assert len(sequences) == 4


def test_unseeded_generators_differ() -> None:
    logits = torch.zeros(1000)
    first = [sample_token(logits, SamplingParams(), make_generator(None)) for _ in range(30)]
    second = [sample_token(logits, SamplingParams(), make_generator(None)) for _ in range(30)]
    assert first != second


def test_penalties_subtract_frequency_times_count_plus_presence() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    generated = [1, 1, 1, 3, 5, 1]  # token 1 four times, tokens 3 and 5 once, others never
    apply_penalties(logits, generated, SamplingParams(frequency_penalty=0.5, presence_penalty=0.25))
    expected = torch.tensor([4.0, 3.0 - 4 * 0.5 - 0.25, 2.0, 1.0 - 0.5 - 0.25, 0.0, -1.0 - 0.5 - 0.25])
    assert torch.equal(logits, expected)


def test_negative_penalties_encourage_repetition() -> None:
    logits = torch.zeros(3)
    apply_penalties(logits, [2, 2], SamplingParams(frequency_penalty=-1.0, presence_penalty=-0.5))
    assert torch.equal(logits, torch.tensor([0.0, 0.0, 2.5]))


@PROPERTY
@given(
    logit_rows,
    st.lists(st.integers(0, 39), max_size=30),
    st.floats(-2, 2, width=32),
    st.floats(-2, 2, width=32),
)
def test_penalties_match_the_openai_formula(
    values: list[float], generated: list[int], frequency: float, presence: float
) -> None:
    generated = [token % len(values) for token in generated]
    logits = _row(values)
    apply_penalties(logits, generated, SamplingParams(frequency_penalty=frequency, presence_penalty=presence))
    expected = [
        value - frequency * generated.count(token) - (presence if token in generated else 0.0)
        for token, value in enumerate(values)
    ]
    torch.testing.assert_close(logits, _row(expected), rtol=1e-5, atol=1e-4)


@PROPERTY
@given(logit_rows, st.lists(st.integers(0, 1), max_size=10))
def test_zero_penalties_leave_logits_untouched(values: list[float], generated: list[int]) -> None:
    logits = _row(values)
    apply_penalties(logits, generated, SamplingParams())
    assert torch.equal(logits, _row(values))


def test_penalties_without_generated_tokens_change_nothing() -> None:
    logits = torch.tensor([1.0, 2.0])
    apply_penalties(logits, [], SamplingParams(frequency_penalty=2.0, presence_penalty=2.0))
    assert torch.equal(logits, torch.tensor([1.0, 2.0]))


def test_penalties_steer_greedy_decoding_away_from_repeats() -> None:
    logits = torch.tensor([1.0, 0.9])
    apply_penalties(logits, [0], SamplingParams(temperature=0.0, presence_penalty=0.5))
    assert sample_token(logits, SamplingParams(temperature=0.0), make_generator(0)) == 1
