"""Incremental detokenization never emits half a character, and loses nothing."""

from __future__ import annotations

from typing import Any

import pytest

from backend.detokenizer import REPLACEMENT, IncrementalDetokenizer

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
