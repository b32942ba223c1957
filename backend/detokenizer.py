"""Incremental detokenization that never splits a UTF-8 character across deltas."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from tokenizers.decoders import DecodeStream

REPLACEMENT = "\ufffd"
# Prompt tokens kept as context so the first generated token decodes with the right spacing.
_CONTEXT_TOKENS = 4


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class _RustDecoder:
    """A ``tokenizers.Tokenizer`` behind the :class:`Decoder` protocol (and transformers' default
    of keeping special tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._decode = tokenizer.decode

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._decode(token_ids, skip_special_tokens=skip_special_tokens))

    def stream(self, context: list[int]) -> Callable[[int], str | None]:
        """Rust's own incremental decoder after ``context``, special tokens left out: one call per
        token instead of two decodes. It returns a token's final text, or None while it holds it."""
        decoder, tokenizer = DecodeStream(ids=context, skip_special_tokens=True), self._tokenizer
        return lambda token: decoder.step(tokenizer, token)


def fast_decoder(tokenizer: Any) -> Decoder:
    """The Rust tokenizer under a transformers one, where it decodes the same text.

    The step loop detokenizes every generated token (with its own stream, or two decodes where a
    special token is kept); transformers' Python wrapper around the same Rust call makes each
    decode about three times as long. Transformers decodes differently
    only where it cleans up spaces, which it does for every model kind but BPE.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer  # type: ignore[no-any-return]
    cleans_up = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    if cleans_up and type(backend.model).__name__ != "BPE":
        return tokenizer  # type: ignore[no-any-return]
    return _RustDecoder(backend)


class IncrementalDetokenizer:
    """Feeds token ids in, gets stable text out.

    Text is released only once it no longer ends in a partial character (a byte-level BPE token
    can carry half of a multi-byte character, which decodes to U+FFFD until the rest arrives).
    Special tokens are left out, except ``kept`` ones (tags a reader needs, such as ``[TOOL_CALLS]``).
    """

    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int] = (), kept: Collection[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._kept = frozenset(kept)
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)
        # The Rust decoder streams by itself where no special token is kept; it releases text where
        # the two decodes below would (tests/backend/test_detokenizer.py walks both).
        self._step = tokenizer.stream(list(self._ids)) if isinstance(tokenizer, _RustDecoder) and not kept else None

    def _decode(self, start: int, end: int | None = None) -> str:
        ids = self._ids[start:end]
        if self._kept.isdisjoint(ids):
            return self._tokenizer.decode(ids, skip_special_tokens=True)
        pieces: list[str] = []
        run: list[int] = []
        for token in ids:
            if token in self._kept:
                pieces.append(self._tokenizer.decode(run, skip_special_tokens=True))
                pieces.append(self._tokenizer.decode([token], skip_special_tokens=False))
                run = []
            else:
                run.append(token)
        pieces.append(self._tokenizer.decode(run, skip_special_tokens=True))
        return "".join(pieces)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became final (possibly empty)."""
        self._ids.append(token_id)
        if self._step is not None:
            text = self._step(token_id)
            if not text:
                return ""
            self._prefix, self._read = self._read, len(self._ids)  # (what flush decodes from)
            return text
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix)
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """The text still held back at the end of generation (an incomplete character decodes to U+FFFD)."""
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix)
        self._prefix = self._read = len(self._ids)
        return after[len(before) :] if len(after) > len(before) else ""
