"""The model's tokenizer as llguidance reads it, with text that a grammar requires always read as text.

llguidance tokenizes the text a grammar forces (a JSON key, a regex's literal part) and offers the
model exactly those tokens. Its own Hugging Face path splits the spelling of a special token out
of that text as the special token itself: a regex ``a<|im_end|>b`` then forces the end token after
``a``, the output ends there and reads as finished. Here the forced text goes through the same
Rust tokenizer with special tokens read as text, so ``<|im_end|>`` in a grammar is seven text
tokens, and a special token is reached only where a grammar names it (``<[id]>``).

The token table and the special tokens are llguidance's own, so masks are the same as before for
every grammar that spells no special token.

Calling back into Python costs each of llguidance's mask threads the GIL, which the step loop holds
while it delivers tokens. A JSON schema that can never force the last character of a special
token's spelling gets llguidance's own tokenizer instead (:class:`PlainTextTokenizer`): what it
forces then never completes a spelling, and both tokenizers read it alike.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
from llguidance import LLTokenizer, TokenizerWrapper
from tokenizers import Tokenizer

# Forced texts repeat (a schema's keys, for every request that uses it): their tokens are kept.
_CACHED_TEXTS = 8192


def control_tokens(hf_tokenizer: Any) -> dict[str, int]:
    """The added tokens llguidance treats as special, by their text: those marked special and every
    ``<...>`` one (Qwen's ``<tool_call>`` and ``<think>`` among them). No client text may become one."""
    added: Mapping[int, Any] = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
    found: dict[str, int] = {}
    for token_id, token in added.items():
        text = str(token)
        if getattr(token, "special", False) or (len(text) > 2 and text.startswith("<") and text.endswith(">")):
            found[text] = int(token_id)
    return found


def _as_llguidance_reads(tokenizer_json: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer as llguidance adapts it: no prepended space (a forced text is never a word's start)."""

    def normalizer(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node.get("type") == "Prepend":
            return None
        if node.get("type") == "Sequence":
            kept = [n for n in (normalizer(n) for n in node.get("normalizers", [])) if n is not None]
            return {**node, "normalizers": kept} if kept else None
        return node

    def pre_tokenizer(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node.get("type") == "Metaspace":
            return {**node, "prepend_scheme": "never", "add_prefix_space": False}
        if node.get("type") == "Sequence":
            return {**node, "pretokenizers": [pre_tokenizer(n) for n in node.get("pretokenizers", [])]}
        return node

    adapted = dict(tokenizer_json)
    adapted["normalizer"] = normalizer(adapted.get("normalizer"))
    adapted["pre_tokenizer"] = pre_tokenizer(adapted.get("pre_tokenizer"))
    adapted["padding"] = adapted["truncation"] = None
    return adapted


class _TextTokenizer:
    """What llguidance's ``TokenizerWrapper`` wraps: the token table, and text to tokens with every
    special token's spelling read as text."""

    def __init__(self, hf_tokenizer: Any, base: LLTokenizer, eos_token_ids: Collection[int]) -> None:
        size = base.vocab_size
        self.tokens = [bytes(base.decode_bytes([token])) for token in range(size)]
        self.special_token_ids = [token for token in range(size) if base.is_special_token(token)]
        self.eos_token_id = min(eos_token_ids)
        self.bos_token_id = None
        backend = copy.copy(hf_tokenizer.backend_tokenizer)
        tokenizer_json = json.loads(backend.to_str())
        self.normalizer: Any = tokenizer_json.get("normalizer")
        self._tokenizer = Tokenizer.from_str(json.dumps(_as_llguidance_reads(tokenizer_json)))
        self._tokenizer.encode_special_tokens = True
        self._known: dict[bytes, list[int]] = {}
        self._lock = threading.Lock()

    def __call__(self, text: bytes) -> list[int]:
        known = self._known.get(text)
        if known is not None:
            return known
        ids: list[int] = self._tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=False).ids
        with self._lock:
            if len(self._known) >= _CACHED_TEXTS:
                self._known.clear()
            self._known[text] = ids
        return ids


# What a regex of llguidance's JSON options (its ``whitespace_pattern``) may be written with: no
# range, negation or class that could stand for a character it does not spell, and only the
# escapes ``\n`` and ``\t``.
_PLAIN_REGEX = frozenset(" ()|?[]{}0123456789,*+")


def _plain_regex(pattern: object) -> bool:
    if not isinstance(pattern, str):
        return False
    characters = iter(pattern)
    for character in characters:
        if character == "\\":
            if next(characters, None) not in ("n", "t"):
                return False
        elif character not in _PLAIN_REGEX:
            return False
    return True


_REGEX_KEYWORDS = frozenset({"pattern", "patternProperties"})
# Normalizers that cannot turn other text into a spelling's last character (NFKC would map the
# fullwidth one, U+FF1E, to '>').
_KEEPING_NORMALIZERS = frozenset({"NFC", "NFD", "Prepend"})


def _keeps_characters(normalizer: Any) -> bool:
    if normalizer is None:
        return True
    if not isinstance(normalizer, dict):
        return False
    if normalizer.get("type") == "Sequence":
        return all(_keeps_characters(node) for node in normalizer.get("normalizers", []))
    return normalizer.get("type") in _KEEPING_NORMALIZERS


@dataclass(frozen=True)
class PlainTextTokenizer:
    """llguidance's own tokenizer, for the grammars it reads exactly as the text-reading one does.

    Both split text alike except where the text holds an added token's spelling. The text llguidance
    tokenizes is the last sampled token followed by what the grammar forces; no ordinary token
    holds a whole spelling (checked when this is built), so a spelling there ends in forced text. A
    JSON schema whose every name, value and literal lacks the spellings' last character, with no
    regex of its own, never forces it: llguidance's structure, numbers and formats do not.
    """

    tokenizer: LLTokenizer
    spelling_ends: frozenset[str]

    def reads_plainly(self, grammar: str) -> bool:
        """Whether ``grammar`` (llguidance's JSON form) is a JSON schema that can never force a spelling's end."""
        try:
            top = json.loads(grammar)
        except (ValueError, RecursionError):  # (nothing is proven of a grammar that cannot be read)
            return False
        if not isinstance(top, dict) or not set(top) <= {"grammars", "max_tokens"}:
            return False
        grammars = top.get("grammars")
        if not isinstance(grammars, list) or len(grammars) != 1 or not isinstance(grammars[0], dict):
            return False
        (entry,) = grammars
        if "json_schema" not in entry or not set(entry) <= {"name", "json_schema", "lark_grammar"}:
            return False
        try:
            return entry.get("lark_grammar") is None and self._plain(entry["json_schema"])
        except RecursionError:
            return False

    def _plain(self, node: Any) -> bool:
        if isinstance(node, str):
            return not self.spelling_ends.intersection(node)
        if isinstance(node, list):
            return all(self._plain(item) for item in node)
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _REGEX_KEYWORDS or not self._plain(key) or not self._plain(value):
                    return False
                if key == "whitespace_pattern" and not _plain_regex(value):
                    return False
            return True
        return True  # numbers, booleans, null


@dataclass(frozen=True)
class GuidanceTokenizers:
    """The text-reading tokenizer every grammar may use, and llguidance's own where it is exact (or None)."""

    text: LLTokenizer
    plain: PlainTextTokenizer | None


def guidance_tokenizers(hf_tokenizer: Any, n_vocab: int, eos_token_ids: Collection[int]) -> GuidanceTokenizers:
    """llguidance's tokenizers for a fast Hugging Face tokenizer and logits ``n_vocab`` wide (the padded
    vocabulary), ending on ``eos_token_ids``."""
    eos = sorted(eos_token_ids)
    base = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab, eos_token=eos)
    reader = _TextTokenizer(hf_tokenizer, base, eos)
    text = LLTokenizer(TokenizerWrapper(reader), n_vocab=n_vocab, eos_token=eos)
    spellings = [str(token) for token in (getattr(hf_tokenizer, "added_tokens_decoder", None) or {}).values()]
    ends = frozenset(spelling[-1] for spelling in spellings if spelling)
    special = set(reader.special_token_ids)
    ordinary = b"\0".join(token for index, token in enumerate(reader.tokens) if index not in special)
    unproven = ends != {">"} or not _keeps_characters(reader.normalizer)
    if unproven or any(spelling.encode() in ordinary for spelling in spellings):
        return GuidanceTokenizers(text, None)  # not proven for this vocabulary: every grammar reads text
    return GuidanceTokenizers(text, PlainTextTokenizer(base, ends))


def guidance_tokenizer(hf_tokenizer: Any, n_vocab: int, eos_token_ids: Collection[int]) -> LLTokenizer:
    """The text-reading tokenizer of :func:`guidance_tokenizers`."""
    return guidance_tokenizers(hf_tokenizer, n_vocab, eos_token_ids).text
