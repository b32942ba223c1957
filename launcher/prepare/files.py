"""What a preparation reads and writes on disk: the source's checks, the output folder, the file moves."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llgtriton.prepared import (
    CHECKPOINT_DIR,
    DOWNLOAD_DIR,
    ENGINE_DIR,
    MANIFEST_NAME,
    TOKENIZER_DIR,
    TRTLLM_CHECKPOINT_DIR,
    Manifest,
    PrepareError,
    TokenizerOverrides,
)

logger = logging.getLogger(__name__)

_MANIFEST_TEMPORARY = MANIFEST_NAME + ".tmp"
_OWN_ENTRIES = frozenset(
    {MANIFEST_NAME, _MANIFEST_TEMPORARY, TOKENIZER_DIR, CHECKPOINT_DIR, ENGINE_DIR, TRTLLM_CHECKPOINT_DIR, DOWNLOAD_DIR}
)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
TOKENIZER_SUBFOLDERS = ("additional_chat_templates",)
# A source needs one of these to have a tokenizer at all.
TOKENIZER_VOCABULARIES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
# Weight formats a checkpoint folder does not need when it has safetensors (repos often ship both).
_OTHER_WEIGHT_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf"})
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class StepFailedError(RuntimeError):
    """A preparation step failed; the message names it. The output folder is left without its manifest."""


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Atomically: a reader sees no manifest or the whole one."""
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / _MANIFEST_TEMPORARY
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(manifest.model_dump_json(indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, folder / MANIFEST_NAME)


@dataclass(frozen=True)
class Source:
    folder: Path  # where the model's files are, or will be once downloaded
    hub_id: str | None = None


def _hub_available() -> bool:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def locate_source(source: str, output: Path) -> Source:
    path = Path(source).expanduser()
    if path.is_dir():
        return Source(path.absolute())
    if path.exists():
        raise PrepareError(f"SOURCE {source!r} is not a directory: give a Hugging Face model folder or a Hub id")
    if not _HUB_ID.fullmatch(source):
        raise PrepareError(f"SOURCE {source!r} does not exist")
    if not _hub_available():
        raise PrepareError(
            f"SOURCE {source!r} is not a directory; download it first (hf download {source} --local-dir DIR), "
            "or install huggingface_hub to let llgtriton prepare download it"
        )
    return Source(output / DOWNLOAD_DIR, hub_id=source)


def _read_vocabulary(tokenizer_json: Path) -> dict[str, int] | None:
    """Token → id from a tokenizer.json (model vocabulary and added tokens); None when unreadable."""
    try:
        data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    raw = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(raw, dict):  # BPE, WordPiece, WordLevel
        vocabulary = {str(token): index for token, index in raw.items() if isinstance(index, int)}
    elif isinstance(raw, list):  # Unigram: [piece, score] in id order
        vocabulary = {str(entry[0]): index for index, entry in enumerate(raw) if isinstance(entry, list) and entry}
    else:
        return None
    for added in data.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("content"), str) and isinstance(added.get("id"), int):
            vocabulary[added["content"]] = added["id"]
    return vocabulary


def check_source(folder: Path, overrides: TokenizerOverrides) -> None:
    if not (folder / "config.json").is_file():
        raise PrepareError(f"SOURCE {folder} has no config.json: it is not a Hugging Face model folder")
    if not any((folder / name).is_file() for name in TOKENIZER_VOCABULARIES):
        raise PrepareError(f"SOURCE {folder} has no tokenizer (none of {', '.join(TOKENIZER_VOCABULARIES)})")
    vocabulary = _read_vocabulary(folder / "tokenizer.json")
    if vocabulary is None:
        return
    problems = []
    size = max(vocabulary.values(), default=-1) + 1
    if overrides.n_vocab_override is not None and overrides.n_vocab_override < size:
        problems.append(
            f"tokenizer.n_vocab_override {overrides.n_vocab_override} is smaller than the tokenizer's "
            f"{size} token ids; it must cover them all (usually the model's logits width)"
        )
    for name, token in (("bos_token", overrides.bos_token), ("eos_token", overrides.eos_token)):
        if token is not None and token not in vocabulary:
            problems.append(f"tokenizer.{name} {token!r} is not a token of {folder / 'tokenizer.json'}")
    if problems:
        raise PrepareError("; ".join(problems))


def previous_entries(output: Path, overwrite: bool) -> list[Path]:
    """What a previous preparation left in ``output``, to remove first (manifest first)."""
    if not output.exists():
        return []
    if not output.is_dir():
        raise PrepareError(f"OUTPUT {output} exists and is not a folder")
    names = sorted(entry.name for entry in output.iterdir())
    if not names:
        return []
    if not overwrite:
        raise PrepareError(f"OUTPUT {output} exists and is not empty; pass --overwrite to prepare it again")
    foreign = [name for name in names if name not in _OWN_ENTRIES]
    if foreign:
        raise PrepareError(
            f"OUTPUT {output} holds files llgtriton prepare did not write ({', '.join(foreign[:5])}); "
            "--overwrite only replaces a previous preparation: choose another folder"
        )
    return sorted((output / name for name in names), key=lambda path: path.name != MANIFEST_NAME)


def remove(paths: Sequence[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def download(hub_id: str, folder: Path, overrides: TokenizerOverrides) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id=hub_id, local_dir=folder)
    except Exception as exc:  # network, authentication, unknown repository: all reported the same way
        raise PrepareError(
            f"cannot download {hub_id!r} from the Hugging Face Hub (no such local folder either): {exc}"
        ) from exc
    check_source(folder, overrides)


def copy_tokenizer(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    for name in TOKENIZER_SUBFOLDERS:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name, dirs_exist_ok=True)


def _checkpoint_files(source: Path) -> list[Path]:
    """The files a Hugging Face checkpoint folder needs: its top-level files, safetensors over other formats."""
    files = sorted(path for path in source.iterdir() if not path.name.startswith(".") and path.is_file())
    if any(path.suffix == ".safetensors" for path in files):
        skipped = [path.name for path in files if path.suffix in _OTHER_WEIGHT_SUFFIXES]
        if skipped:
            logger.info("safetensors present; not taking %s", ", ".join(skipped))
        files = [path for path in files if path.suffix not in _OTHER_WEIGHT_SUFFIXES]
    return files


def _place(source: Path, target: Path, how: Literal["link", "copy", "move"]) -> str:
    if how == "move":
        os.replace(source, target)
        return "moved"
    if how == "link":
        try:
            os.link(source, target)  # follows symlinks, as a Hub cache snapshot is made of
            return "linked"
        except OSError as exc:  # another filesystem, or one without hardlinks
            logger.debug("cannot hardlink %s (%s); copying it", source, exc)
    shutil.copy2(source, target)
    return "copied"


def place_checkpoint(source: Path, target: Path, how: Literal["link", "copy", "move"]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    done: dict[str, int] = {}
    for path in _checkpoint_files(source):
        verb = _place(path, target / path.name, how)
        done[verb] = done.get(verb, 0) + 1
    logger.info("checkpoint files: %s", ", ".join(f"{count} {verb}" for verb, count in sorted(done.items())))


def check_engine(folder: Path) -> None:
    if not (folder / "config.json").is_file() or not any(folder.glob("rank*.engine")):
        raise StepFailedError(
            f"trtllm-build exited without writing an engine (rank*.engine, config.json) into {folder}"
        )
