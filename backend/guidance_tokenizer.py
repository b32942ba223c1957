"""The model's tokenizer as llguidance reads it, with text that a grammar requires always read as text.

llguidance tokenizes the text a grammar forces (a JSON key, a regex's literal part) and offers the
model exactly those tokens. Its own Hugging Face path splits the spelling of a special token out
of that text as the special token itself: a regex ``a<|im_end|>b`` then forces the end token after
``a``, the output ends there and reads as finished. Here the forced text goes through the same
Rust tokenizer with special tokens read as text, so ``<|im_end|>`` in a grammar is seven text
tokens, and a special token is reached only where a grammar names it (``<[id]>``).

The token table and the special tokens are llguidance's own, so masks are the same as before for
every grammar that spells no special token.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Collection, Mapping
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
        self._tokenizer = Tokenizer.from_str(json.dumps(_as_llguidance_reads(json.loads(backend.to_str()))))
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


def guidance_tokenizer(hf_tokenizer: Any, n_vocab: int, eos_token_ids: Collection[int]) -> LLTokenizer:
    """llguidance's tokenizer for a fast Hugging Face tokenizer and logits ``n_vocab`` wide (the padded
    vocabulary), ending on ``eos_token_ids``."""
    eos = sorted(eos_token_ids)
    base = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab, eos_token=eos)
    return LLTokenizer(TokenizerWrapper(_TextTokenizer(hf_tokenizer, base, eos)), n_vocab=n_vocab, eos_token=eos)
