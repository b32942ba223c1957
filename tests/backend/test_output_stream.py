"""backend.output_stream's TokenHistory: a prompt and its generated tokens read as one list, uncopied."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.output_stream import TokenHistory

TOKENS = st.lists(st.integers(0, 50000), max_size=12)


@settings(max_examples=500, deadline=None)
@given(TOKENS, TOKENS, st.integers(-15, 30), st.integers(-15, 30), st.sampled_from([None, 1, 2, -1]))
def test_it_reads_as_the_joined_list(
    prompt: list[int], generated: list[int], start: int, stop: int, step: int | None
) -> None:
    joined = [*prompt, *generated]
    history = TokenHistory(tuple(prompt), generated)
    assert len(history) == len(joined)
    assert list(history) == joined
    assert history[start:stop:step] == joined[start:stop:step]
    for index in range(-len(joined), len(joined)):
        assert history[index] == joined[index]


def test_an_empty_slice_past_the_prompt_is_empty() -> None:
    """(Found by hypothesis: a stop before the start must not wrap around the generated tokens.)"""
    assert TokenHistory((0,), [0, 0])[1:0] == []


def test_it_sees_tokens_generated_after_it_was_made_and_refuses_indexes_past_the_end() -> None:
    generated = [7]
    history = TokenHistory((1, 2), generated)
    generated.append(8)
    assert history[2:] == [7, 8] and len(history) == 4
    with pytest.raises(IndexError):
        history[4]
