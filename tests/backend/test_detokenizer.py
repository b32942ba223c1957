"""Incremental detokenization never emits half a character, and loses nothing."""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.detokenizer import REPLACEMENT, IncrementalDetokenizer, fast_decoder
from tests.backend.llama_tokenizer import llama_tokenizer

TEXTS = ["中文：你好，世界。我们看到的美国", "Emoji: 😀😃😄 café naïve", "plain ascii, with  spaces\nand lines"]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_are_whole_characters_and_add_up(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode("Say:", add_special_tokens=False))
    deltas = [detokenizer.push(token) for token in ids]
    deltas.append(detokenizer.flush())
    assert all(REPLACEMENT not in delta for delta in deltas)
    assert "".join(deltas) == tokenizer.decode(ids)


def test_split_characters_are_held_back(tokenizer: Any) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1, "the emoji should take several byte-level tokens"
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.push(token) for token in ids[:-1]] == [""] * (len(ids) - 1)
    assert detokenizer.push(ids[-1]) == "😀"


def test_flush_releases_an_incomplete_character_as_replacement(tokenizer: Any) -> None:
    ids = tokenizer.encode("a😀", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    emitted = "".join(detokenizer.push(token) for token in ids[:-1])
    assert emitted == "a"
    assert detokenizer.flush() == REPLACEMENT


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_the_fast_decoder_decodes_what_transformers_decodes(tokenizer: Any, skip_special_tokens: bool) -> None:
    decoder = fast_decoder(tokenizer)
    assert decoder is not tokenizer, "SmolLM2's BPE tokenizer has a Rust decoder to use"
    rng = random.Random(0)
    specials = sorted(tokenizer.all_special_ids)
    for text in [*TEXTS, " , . ?  spaces before punctuation", "<|im_start|>user\nhi<|im_end|>"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        assert decoder.decode(ids, skip_special_tokens=skip_special_tokens) == tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens
        )
    random_ids = [rng.randrange(tokenizer.vocab_size) for _ in range(500)]
    assert decoder.decode(random_ids) == tokenizer.decode(random_ids)


def test_streams_through_the_fast_decoder_add_up_to_the_text(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXTS[0] + TEXTS[1], add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(fast_decoder(tokenizer), tokenizer.encode("Say:", add_special_tokens=False))
    deltas = [detokenizer.push(token) for token in ids] + [detokenizer.flush()]
    assert all(REPLACEMENT not in delta for delta in deltas)
    assert "".join(deltas) == tokenizer.decode(ids)


def test_a_bpe_tokenizer_that_asks_for_clean_up_keeps_its_spaces_either_way() -> None:
    tokenizer = llama_tokenizer()  # clean_up_tokenization_spaces: true, which transformers ignores for BPE
    ids = tokenizer.encode('{"a" : 1 , "b" : "x . y ?"}', add_special_tokens=False)
    assert fast_decoder(tokenizer).decode(ids) == tokenizer.decode(ids) == '{"a" : 1 , "b" : "x . y ?"}'


_LLAMA = functools.cache(llama_tokenizer)


def deltas_of(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detokenizer.push(token) for token in ids] + [detokenizer.flush()]


# Runs of tokens cut anywhere: multi-byte characters split across tokens, and cut off at the end.
_PIECES = st.lists(
    st.tuples(st.sampled_from([*TEXTS, "a😀", " ü中😃x"]), st.integers(0, 40), st.integers(0, 40)), max_size=4
)


@settings(deadline=None, max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=_PIECES, noise=st.lists(st.integers(0, 49_151), max_size=6), context=st.integers(0, 6))
def test_the_rust_decoders_own_stream_releases_what_two_decodes_release(
    tokenizer: Any, pieces: list[tuple[str, int, int]], noise: list[int], context: int
) -> None:
    """The step loop's detokenizer (Rust's incremental decoder) against transformers' two decodes a
    token: the same deltas at the same tokens, and the same flush."""
    ids: list[int] = list(noise)
    for text, start, length in pieces:
        ids.extend(tokenizer.encode(text, add_special_tokens=False)[start : start + length])
    prompt = tokenizer.encode("Say: 😀 hi", add_special_tokens=False)[-context:] if context else []
    for tokens in (tokenizer, _LLAMA()):
        assert deltas_of(IncrementalDetokenizer(fast_decoder(tokens), prompt), ids) == deltas_of(
            IncrementalDetokenizer(tokens, prompt), ids
        )
