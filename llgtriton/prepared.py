"""The prepared-model folder: what ``llgtriton prepare`` writes and the TensorRT-LLM engine reads.

    OUTPUT/
      llgtriton-model.json   written last and atomically: a folder without it is not ready
      tokenizer/             tokenizer files, chat template, generation_config.json, config.json
      checkpoint/            serve == "checkpoint": the Hugging Face checkpoint, hardlinked or copied
      engine/                serve == "engine": trtllm-build's output (rank*.engine, config.json)

Shared ground: the launcher writes it (``launcher.prepare``), the backend reads it; neither imports
the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST_NAME = "llgtriton-model.json"
MANIFEST_FORMAT: Final = 1
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_DIR = "checkpoint"
ENGINE_DIR = "engine"
# Folders a preparation makes in OUTPUT while it runs, and removes before it writes the manifest.
TRTLLM_CHECKPOINT_DIR = ".trtllm-checkpoint"  # convert_checkpoint.py's output
DOWNLOAD_DIR = ".download"  # a Hub id's snapshot


class PrepareError(ValueError):
    """The configuration, the source or the output folder cannot be used; the message says why and where."""


class FrozenModel(BaseModel):
    """A frozen pydantic model that refuses unknown keys (what a config or a manifest is read into)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TokenizerOverrides(FrozenModel):
    n_vocab_override: int | None = Field(
        None, ge=1, description="Logits width the constraint masks cover (the padded vocabulary); default: the model's."
    )
    bos_token: str | None = Field(
        None, min_length=1, description="Beginning-of-sequence token, if the tokenizer's is wrong."
    )
    eos_token: str | None = Field(None, min_length=1, description="End-of-sequence token, if the tokenizer's is wrong.")


_M = TypeVar("_M", bound=BaseModel)


def validated(model: type[_M], raw: object, origin: str) -> _M:
    """``raw`` as ``model``; every problem in one :class:`PrepareError` naming ``origin``."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "\n".join(
            f"  {'.'.join(str(part) for part in error['loc']) or '(top level)'}: {line}"
            for error in exc.errors()
            for line in error["msg"].splitlines()  # one line per problem (the argument checks report several)
        )
        raise PrepareError(f"invalid {origin}:\n{problems}") from None


class Manifest(FrozenModel):
    """``llgtriton-model.json``: what was prepared and how it is served."""

    format: Literal[1] = MANIFEST_FORMAT
    source: str
    serve: Literal["checkpoint", "engine"]
    tokenizer: TokenizerOverrides


class PreparedModel(FrozenModel):
    folder: Path
    manifest: Manifest

    @property
    def tokenizer_dir(self) -> Path:
        return self.folder / TOKENIZER_DIR

    @property
    def checkpoint_dir(self) -> Path | None:
        return self.folder / CHECKPOINT_DIR if self.manifest.serve == "checkpoint" else None

    @property
    def engine_dir(self) -> Path | None:
        return self.folder / ENGINE_DIR if self.manifest.serve == "engine" else None

    @property
    def model_dir(self) -> Path:
        """What is served: the checkpoint folder or the engine folder."""
        return self.folder / (CHECKPOINT_DIR if self.manifest.serve == "checkpoint" else ENGINE_DIR)


def read_prepared(folder: Path) -> PreparedModel | None:
    """The prepared model in ``folder``; None when it has no manifest (not prepared, or not finished)."""
    path = folder / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # not prepared, or a model file rather than a folder
        return None
    except OSError as exc:
        raise PrepareError(f"cannot read {path}: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PrepareError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and data.get("format") != MANIFEST_FORMAT:
        raise PrepareError(
            f"{path} has format {data.get('format')!r}; this llgtriton reads format {MANIFEST_FORMAT}: "
            "prepare the model again with it"
        )
    prepared = PreparedModel(folder=folder, manifest=validated(Manifest, data, str(path)))
    missing = [str(p) for p in (prepared.tokenizer_dir, prepared.model_dir) if not p.is_dir()]
    if missing:
        raise PrepareError(f"{folder} is incomplete: {', '.join(missing)} missing; prepare it again")
    return prepared
