"""What the trtllm engine serves, found from ``engine.model``: a prepared folder, a checkpoint or an engine.

- a folder made by ``llgtriton prepare`` (``llgtriton-model.json``): its ``checkpoint/`` or
  ``engine/``, its ``tokenizer/`` and tokenizer overrides (``n_vocab_override``, ``bos_token``, ``eos_token``);
- a Hugging Face checkpoint directory (``config.json`` with ``architectures``): served as it is;
- a TensorRT-LLM engine directory (``config.json`` with ``build_config``, ``rank*.engine``): needs a
  tokenizer, so it is only accepted inside a prepared folder.

Only the tokenizer and the configuration are read here; the weights are TensorRT-LLM's business.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llguidance import LLMatcher, LLTokenizer

from backend.errors import BackendError
from backend.grammar_cache import GrammarCache, GrammarCopy, lanes_for
from backend.guidance_tokenizer import guidance_tokenizers
from backend.model_loader import eos_token_ids
from llgtriton.prepared import PrepareError, TokenizerOverrides, read_prepared
from llgtriton.settings import EngineSettings

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048


class ModelFilesError(BackendError):
    """The configured model folder cannot be served by the trtllm engine."""


@dataclass(frozen=True)
class TrtllmModel:
    kind: Literal["checkpoint", "engine"]
    model_dir: Path  # what TensorRT-LLM loads
    tokenizer_dir: Path
    tokenizer: Any  # a transformers tokenizer
    eos_token_ids: frozenset[int]
    pad_token_id: int | None
    vocab_size: int  # the logits width: the model's vocabulary, or the override
    max_model_len: int
    guidance_tokenizer: LLTokenizer = field(repr=False, compare=False)  # llguidance's, as wide as the logits
    _grammars: GrammarCache = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.model_dir.parent.name if self.model_dir.name in {"checkpoint", "engine"} else self.model_dir.name

    def verifier(self, grammar: str | None) -> LLMatcher | None:
        """A matcher that checks the engine's output tokens against ``grammar`` (compiled once per grammar)."""
        return None if grammar is None else self._grammars.matcher(grammar)

    def grammar_copy(self, grammar: str | None) -> GrammarCopy | None:
        """The post-processor's own copy of ``grammar``, with its lane (see :class:`GrammarCache`)."""
        return None if grammar is None else self._grammars.copy(grammar)


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFilesError(f"{folder} has no config.json: it is not a checkpoint or an engine") from None
    except ValueError as exc:
        raise ModelFilesError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFilesError(f"{path} is not a JSON object")
    return data


def _engine_vocab_and_context(config: dict[str, Any]) -> tuple[int | None, int | None]:
    pretrained = config.get("pretrained_config", {})
    build = config.get("build_config", {})
    return pretrained.get("vocab_size"), build.get("max_seq_len")


def _locate(settings: EngineSettings) -> tuple[Literal["checkpoint", "engine"], Path, Path, TokenizerOverrides]:
    folder = Path(settings.model).expanduser()
    if not folder.is_dir():
        raise ModelFilesError(
            f"the trtllm engine serves a folder (from 'llgtriton prepare', or a Hugging Face checkpoint); "
            f"{settings.model!r} is not one"
        )
    try:
        prepared = read_prepared(folder)
    except PrepareError as exc:
        raise ModelFilesError(str(exc)) from None
    if prepared is not None:
        return prepared.manifest.serve, prepared.model_dir, prepared.tokenizer_dir, prepared.manifest.tokenizer
    if "build_config" in _config(folder):
        raise ModelFilesError(
            f"{folder} is a TensorRT-LLM engine without a tokenizer; make a model folder with "
            "'llgtriton prepare' (it keeps the tokenizer beside the engine)"
        )
    return "checkpoint", folder, folder, TokenizerOverrides()


def _eos_ids(tokenizer: Any, folder: Path) -> frozenset[int]:
    generation = folder / "generation_config.json"
    configured = None
    if generation.is_file():
        configured = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
    ids = eos_token_ids(configured, tokenizer)
    if not ids:
        raise ModelFilesError(f"{folder} defines no end-of-sequence token (set eos_token in 'llgtriton prepare')")
    return ids


def load_model_files(settings: EngineSettings) -> TrtllmModel:
    from transformers import AutoTokenizer

    kind, model_dir, tokenizer_dir, overrides = _locate(settings)
    special = {name: value for name in ("bos_token", "eos_token") if (value := getattr(overrides, name)) is not None}
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, **special)
    except (OSError, ValueError) as exc:
        raise ModelFilesError(f"cannot load the tokenizer in {tokenizer_dir}: {exc}") from exc
    config = _config(model_dir)
    if kind == "engine":
        vocab, context = _engine_vocab_and_context(config)
    else:
        vocab, context = config.get("vocab_size"), config.get("max_position_embeddings")
    vocab_size = overrides.n_vocab_override or vocab or len(tokenizer)
    if vocab_size < len(tokenizer):
        raise ModelFilesError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is {vocab_size}; "
            "set n_vocab_override in 'llgtriton prepare'"
        )
    context = int(context or DEFAULT_CONTEXT)
    eos = _eos_ids(tokenizer, tokenizer_dir)
    tokenizers = guidance_tokenizers(tokenizer, vocab_size, eos)
    return TrtllmModel(
        kind=kind,
        model_dir=model_dir,
        tokenizer_dir=tokenizer_dir,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        pad_token_id=tokenizer.pad_token_id if isinstance(tokenizer.pad_token_id, int) else None,
        vocab_size=vocab_size,
        max_model_len=min(settings.max_model_len or context, context),
        guidance_tokenizer=tokenizers.text,
        # The post-processor's executor has a thread per usable core.
        _grammars=GrammarCache(tokenizers.text, lanes=lanes_for(), plain_tokenizer=tokenizers.plain),
    )
