"""``llgtriton prepare``: turn a Hugging Face model into a folder the TensorRT-LLM engine serves.

    llgtriton prepare ./Llama-3.1-8B-Instruct ./prepared      # served by the LLM API (PyTorch backend)
    llgtriton prepare --config prepare.yaml                    # with ``build:``, a TensorRT engine
    llgtriton prepare --config prepare.yaml --dry-run          # print the steps, change nothing

The output folder is the contract with the backend: :mod:`llgtriton.prepared` describes it.

Pure Python: nothing here imports torch, transformers or tensorrt_llm (it runs in the slim image
too). The engine build runs TensorRT-LLM's own ``convert_checkpoint.py`` and ``trtllm-build`` as
subprocesses; their arguments are checked by name before anything runs. Relative paths are
relative to the current directory.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from llgtriton.logs import configure_logging
from llgtriton.prepared import (
    CHECKPOINT_DIR,
    ENGINE_DIR,
    MANIFEST_NAME,
    TOKENIZER_DIR,
    FrozenModel,
    Manifest,
    PreparedModel,
    PrepareError,
    TokenizerOverrides,
    read_prepared,
    validated,
)

logger = logging.getLogger(__name__)

TRTLLM_CHECKPOINT_DIR = ".trtllm-checkpoint"  # convert_checkpoint.py's output, removed once the engine is built
DOWNLOAD_DIR = ".download"  # a Hub id's snapshot, removed once its files are in place
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


# Tool arguments ---------------------------------------------------------------------------------

ArgValue = str | int | float | bool | list[str]
# switch: a store_true flag (true: --name, false: omitted); feature: --name enable|disable;
# plugin: --name <dtype>|disable; value: --name <value>; values: --name <v1> <v2> ...
OptionKind = Literal["switch", "feature", "plugin", "value", "values"]

# fmt: off
# trtllm-build's long options: tensorrt_llm/commands/build.py (parse_arguments) and the plugin
# options it adds from tensorrt_llm/plugin/plugin.py (cli_plugin_args), TensorRT-LLM tag v1.2.0.
TRTLLM_BUILD_SWITCHES = frozenset({
    "strip_plan", "weight_sparsity", "weight_streaming", "fast_build", "enable_debug_output", "dry_run",
    "monitor_memory", "gather_context_logits", "gather_generation_logits", "gather_all_token_logits",
})
TRTLLM_BUILD_FEATURES = frozenset({
    "context_fmha", "bert_context_fmha_fp32_acc", "remove_input_padding", "paged_kv_cache", "use_paged_context_fmha",
    "use_fp8_context_fmha", "fuse_fp4_quant", "multiple_profiles", "paged_state", "streamingllm", "norm_quant_fusion",
    "reduce_fusion", "user_buffer", "use_fused_mlp", "pp_reduce_scatter", "dora_plugin",
})
TRTLLM_BUILD_PLUGINS = frozenset({
    "bert_attention_plugin", "gpt_attention_plugin", "gemm_plugin", "gemm_swiglu_plugin", "fp8_rowwise_gemm_plugin",
    "lora_plugin", "moe_plugin", "mamba_conv1d_plugin", "nccl_plugin", "low_latency_gemm_plugin",
    "low_latency_gemm_swiglu_plugin", "gemm_allreduce_plugin",
})
TRTLLM_BUILD_VALUES = frozenset({
    "build_config", "model_cls_file", "model_cls_name", "max_batch_size", "max_input_len", "max_seq_len",
    "max_decoder_seq_len", "max_beam_width", "max_num_tokens", "opt_num_tokens", "max_encoder_input_len",
    "max_prompt_embedding_table_size", "max_multimodal_len", "kv_cache_type", "tokens_per_block",
    "input_timing_cache", "output_timing_cache", "profiling_verbosity", "workers", "log_level", "visualize_network",
    "logits_dtype", "lora_ckpt_source", "max_lora_rank", "speculative_decoding_mode", "max_draft_len",
})
# fmt: on
TRTLLM_BUILD_LISTS = frozenset({"lora_dir", "lora_target_modules"})
TRTLLM_BUILD_SET_BY_US = {
    "checkpoint_dir": f"OUTPUT/{TRTLLM_CHECKPOINT_DIR}, the converted checkpoint",
    "output_dir": f"OUTPUT/{ENGINE_DIR}",
    "model_config": "--checkpoint_dir, which trtllm-build prefers to it",
}
TRTLLM_BUILD_ARGS = (
    TRTLLM_BUILD_SWITCHES
    | TRTLLM_BUILD_FEATURES
    | TRTLLM_BUILD_PLUGINS
    | TRTLLM_BUILD_VALUES
    | TRTLLM_BUILD_LISTS
    | frozenset(TRTLLM_BUILD_SET_BY_US)
)

# fmt: off
# The flags most examples/models/core/<family>/convert_checkpoint.py scripts share (llama's, v1.2.0).
# A family's own flags go in build.convert.extra_args, passed through unchecked.
CONVERT_SWITCHES = frozenset({
    "use_weight_only", "disable_weight_only_quant_plugin", "per_group", "per_channel", "per_token", "int8_kv_cache",
    "fp8_kv_cache", "use_fp8", "use_fp8_rowwise", "use_nvfp4", "use_qserve", "use_parallel_embedding",
    "load_by_shard", "load_model_on_cpu",
})
CONVERT_VALUES = frozenset({
    "dtype", "tp_size", "pp_size", "cp_size", "moe_tp_size", "moe_ep_size", "weight_only_precision", "group_size",
    "smoothquant", "quant_ckpt_path", "calib_dataset", "calib_size", "calib_max_seq_length", "embedding_sharding_dim",
    "workers", "log_level",
})
# fmt: on
CONVERT_SET_BY_US = {
    "model_dir": "SOURCE",
    "output_dir": f"OUTPUT/{TRTLLM_CHECKPOINT_DIR}",
}


@dataclass(frozen=True)
class _Tool:
    label: str
    kinds: Mapping[str, OptionKind]
    set_by_us: Mapping[str, str]
    hint: str = ""

    def problems(self, args: Mapping[Any, Any]) -> list[str]:
        problems = []
        for key, value in args.items():
            name = str(key)
            if name in self.set_by_us:
                problems.append(f"'{name}' is set by llgtriton prepare ({self.set_by_us[name]}); remove it")
            elif name not in self.kinds:
                problems.append(self._unknown(name))
            elif (problem := _value_problem(name, self.kinds[name], value)) is not None:
                problems.append(problem)
        return problems

    def _unknown(self, name: str) -> str:
        known = sorted(set(self.kinds) | set(self.set_by_us))
        wanted = name.lstrip("-").replace("-", "_")
        close = difflib.get_close_matches(wanted, known, n=3) or [k for k in known if k.startswith(wanted)][:3]
        guess = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return f"unknown {self.label} argument '{name}'{guess}{self.hint}"

    def argv(self, args: Mapping[str, ArgValue]) -> list[str]:
        argv: list[str] = []
        for name, value in args.items():
            flag = f"--{name}"
            kind = self.kinds[name]
            if isinstance(value, list):
                argv += [flag, *value]
            elif isinstance(value, bool):
                if kind == "switch":
                    argv += [flag] if value else []
                elif kind == "feature":
                    argv += [flag, "enable" if value else "disable"]
                else:  # a plugin: only false passes validation
                    argv += [flag, "disable"]
            else:
                argv += [flag, str(value)]
        return argv


def _kinds(groups: Mapping[OptionKind, frozenset[str]]) -> dict[str, OptionKind]:
    return {name: kind for kind, names in groups.items() for name in names}


TRTLLM_BUILD = _Tool(
    "trtllm-build",
    _kinds(
        {
            "switch": TRTLLM_BUILD_SWITCHES,
            "feature": TRTLLM_BUILD_FEATURES,
            "plugin": TRTLLM_BUILD_PLUGINS,
            "value": TRTLLM_BUILD_VALUES,
            "values": TRTLLM_BUILD_LISTS,
        }
    ),
    TRTLLM_BUILD_SET_BY_US,
)
CONVERT_CHECKPOINT = _Tool(
    "convert_checkpoint.py",
    _kinds({"switch": CONVERT_SWITCHES, "value": CONVERT_VALUES}),
    CONVERT_SET_BY_US,
    hint="; a flag of one model family goes in build.convert.extra_args",
)


def _value_problem(name: str, kind: OptionKind, value: object) -> str | None:
    is_bool = isinstance(value, bool)
    is_scalar = isinstance(value, str | int | float) and not is_bool
    expected = {
        "switch": (is_bool, "true or false"),
        "feature": (is_bool or value in ("enable", "disable"), "true or false (or enable/disable)"),
        "plugin": (value is False or isinstance(value, str), "a dtype (auto, float16, bfloat16, ...) or false"),
        "value": (is_scalar, "a string or a number"),
        "values": (
            is_scalar or (isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)),
            "a string or a list of strings",
        ),
    }
    ok, what = expected[kind]
    return None if ok else f"'{name}' takes {what}, not {json.dumps(value, default=str)}"


def _arguments_error(problems: list[str]) -> PydanticCustomError:
    return PydanticCustomError("llgtriton_arguments", "{problems}", {"problems": "\n".join(problems)})


# Configuration ----------------------------------------------------------------------------------


class ConvertStep(FrozenModel):
    script: Path = Field(description="The model family's convert_checkpoint.py, e.g. examples/models/core/llama/...")
    args: dict[str, ArgValue] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list, description="Passed through unchecked, after args.")

    @field_validator("args", mode="before")
    @classmethod
    def _known_arguments(cls, value: object) -> object:
        if isinstance(value, Mapping) and (problems := CONVERT_CHECKPOINT.problems(value)):
            raise _arguments_error(problems)
        return value

    @field_validator("extra_args")
    @classmethod
    def _not_ours(cls, value: list[str]) -> list[str]:
        problems = [
            f"'{arg}' is set by llgtriton prepare; remove it"
            for arg in value
            if arg.split("=", 1)[0] in {f"--{name}" for name in CONVERT_SET_BY_US}
        ]
        if problems:
            raise _arguments_error(problems)
        return value


class EngineBuildStep(FrozenModel):
    args: dict[str, ArgValue] = Field(default_factory=dict)

    @field_validator("args", mode="before")
    @classmethod
    def _known_arguments(cls, value: object) -> object:
        if isinstance(value, Mapping) and (problems := TRTLLM_BUILD.problems(value)):
            raise _arguments_error(problems)
        return value


class BuildConfig(FrozenModel):
    convert: ConvertStep
    engine: EngineBuildStep = Field(default_factory=EngineBuildStep)


class PrepareConfig(FrozenModel):
    source: str = Field(min_length=1, description="A Hugging Face model folder, or a Hub id.")
    output: Path
    tokenizer: TokenizerOverrides = Field(default_factory=TokenizerOverrides)
    weights: Literal["copy", "link"] = Field(
        "link", description="link: hardlink the checkpoint files (copy across filesystems); copy: always copy."
    )
    build: BuildConfig | None = Field(
        None, description="Build a TensorRT engine; unset: serve the checkpoint through the LLM API (PyTorch backend)."
    )


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PrepareError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise PrepareError(f"cannot read config file {path}: {exc}") from None
    if path.suffix.lower() in {".yaml", ".yml"}:
        data = _parse_yaml(text, path)
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PrepareError(f"config file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PrepareError(f"config file {path} must hold a mapping (source, output, ...), not {type(data).__name__}")
    return data


def _parse_yaml(text: str, path: Path) -> object:
    try:
        import yaml
    except ImportError:
        raise PrepareError(f"reading {path} needs PyYAML (pip install pyyaml); or write the config as JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PrepareError(f"config file {path} is not valid YAML: {exc}") from None


def load_prepare_config(path: Path) -> PrepareConfig:
    """A prepare config from a YAML (``.yaml``/``.yml``) or JSON file; every problem in one PrepareError."""
    return validated(PrepareConfig, _read_config_file(path), f"config file {path}")


def _write_manifest(folder: Path, manifest: Manifest) -> None:
    """Atomically: a reader sees no manifest or the whole one."""
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / _MANIFEST_TEMPORARY
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(manifest.model_dump_json(indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, folder / MANIFEST_NAME)


# Checks -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    folder: Path  # where the model's files are, or will be once downloaded
    hub_id: str | None = None


def _hub_available() -> bool:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def _locate_source(source: str, output: Path) -> _Source:
    path = Path(source).expanduser()
    if path.is_dir():
        return _Source(path.absolute())
    if path.exists():
        raise PrepareError(f"SOURCE {source!r} is not a directory: give a Hugging Face model folder or a Hub id")
    if not _HUB_ID.fullmatch(source):
        raise PrepareError(f"SOURCE {source!r} does not exist")
    if not _hub_available():
        raise PrepareError(
            f"SOURCE {source!r} is not a directory; download it first (hf download {source} --local-dir DIR), "
            "or install huggingface_hub to let llgtriton prepare download it"
        )
    return _Source(output / DOWNLOAD_DIR, hub_id=source)


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


def _check_source(folder: Path, overrides: TokenizerOverrides) -> None:
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


def _previous_entries(output: Path, overwrite: bool) -> list[Path]:
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


# Actions ----------------------------------------------------------------------------------------


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _download(hub_id: str, folder: Path, overrides: TokenizerOverrides) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id=hub_id, local_dir=folder)
    except Exception as exc:  # network, authentication, unknown repository: all reported the same way
        raise PrepareError(
            f"cannot download {hub_id!r} from the Hugging Face Hub (no such local folder either): {exc}"
        ) from exc
    _check_source(folder, overrides)


def _copy_tokenizer(source: Path, target: Path) -> None:
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


def _place_checkpoint(source: Path, target: Path, how: Literal["link", "copy", "move"]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    done: dict[str, int] = {}
    for path in _checkpoint_files(source):
        verb = _place(path, target / path.name, how)
        done[verb] = done.get(verb, 0) + 1
    logger.info("checkpoint files: %s", ", ".join(f"{count} {verb}" for verb, count in sorted(done.items())))


def _check_engine(folder: Path) -> None:
    if not (folder / "config.json").is_file() or not any(folder.glob("rank*.engine")):
        raise StepFailedError(
            f"trtllm-build exited without writing an engine (rank*.engine, config.json) into {folder}"
        )


# Plan and run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a preparation: a command to run, or a Python action."""

    description: str
    argv: tuple[str, ...] = ()
    action: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if bool(self.argv) == (self.action is not None):
            raise ValueError("a Step has either argv or an action")

    def render(self) -> str:
        return shlex.join(self.argv) if self.argv else f"# {self.description}"


class Runner(Protocol):
    def __call__(self, args: Sequence[str], /, *, check: bool) -> subprocess.CompletedProcess[Any]: ...


def plan(config: PrepareConfig, *, overwrite: bool = False) -> list[Step]:
    """The steps that prepare ``config.output``; checks the source and the output folder on the way."""
    output = config.output.expanduser().absolute()
    source = _locate_source(config.source, output)
    if source.hub_id is None:
        _check_source(source.folder, config.tokenizer)
    if config.build is not None:
        script = config.build.convert.script.expanduser()
        if not script.is_file():
            raise PrepareError(f"build.convert.script: {script} does not exist")
    steps: list[Step] = []
    previous = _previous_entries(output, overwrite)
    if previous:
        steps.append(
            Step(f"remove the previous preparation from {output}", action=functools.partial(_remove, previous))
        )
    if source.hub_id is not None:
        steps.append(
            Step(
                f"download {source.hub_id} from the Hugging Face Hub into {source.folder}",
                action=functools.partial(_download, source.hub_id, source.folder, config.tokenizer),
            )
        )
    steps.append(
        Step(
            f"copy the tokenizer files into {output / TOKENIZER_DIR}",
            action=functools.partial(_copy_tokenizer, source.folder, output / TOKENIZER_DIR),
        )
    )
    intermediates = [source.folder] if source.hub_id is not None else []
    if config.build is None:
        how: Literal["link", "copy", "move"] = "move" if source.hub_id is not None else config.weights
        steps.append(
            Step(
                f"{how} the checkpoint files into {output / CHECKPOINT_DIR}",
                action=functools.partial(_place_checkpoint, source.folder, output / CHECKPOINT_DIR, how),
            )
        )
    else:
        steps += _build_steps(config.build, source.folder, output)
        intermediates.insert(0, output / TRTLLM_CHECKPOINT_DIR)
    if intermediates:
        steps.append(
            Step(
                f"remove the intermediate {', '.join(path.name for path in intermediates)}",
                action=functools.partial(_remove, intermediates),
            )
        )
    manifest = Manifest(
        source=config.source, serve="checkpoint" if config.build is None else "engine", tokenizer=config.tokenizer
    )
    steps.append(Step(f"write {output / MANIFEST_NAME}", action=functools.partial(_write_manifest, output, manifest)))
    return steps


def _build_steps(build: BuildConfig, source: Path, output: Path) -> list[Step]:
    checkpoint, engine = output / TRTLLM_CHECKPOINT_DIR, output / ENGINE_DIR
    script = build.convert.script.expanduser().absolute()
    convert = [sys.executable, str(script), "--model_dir", str(source), "--output_dir", str(checkpoint)]
    convert += [*CONVERT_CHECKPOINT.argv(build.convert.args), *build.convert.extra_args]
    trtllm_build = shutil.which("trtllm-build") or "trtllm-build"
    engine_build = [trtllm_build, "--checkpoint_dir", str(checkpoint), "--output_dir", str(engine)]
    engine_build += TRTLLM_BUILD.argv(build.engine.args)
    return [
        Step(f"convert the checkpoint for TensorRT-LLM ({script.name})", argv=tuple(convert)),
        Step("build the TensorRT engine (trtllm-build)", argv=tuple(engine_build)),
        Step(f"check the engine in {engine}", action=functools.partial(_check_engine, engine)),
    ]


def _check_programs(steps: Sequence[Step]) -> None:
    for step in steps:
        if step.argv and shutil.which(step.argv[0]) is None:
            raise PrepareError(f"{step.argv[0]} is not on PATH; the step '{step.description}' needs it")


def run_steps(steps: Sequence[Step], runner: Runner = subprocess.run) -> None:
    total = len(steps)
    for number, step in enumerate(steps, 1):
        name = f"step {number}/{total} ({step.description})"
        logger.info("%s", name)
        try:
            if step.action is not None:
                step.action()
                continue
            logger.info("running %s", step.render())
            returncode = runner(step.argv, check=False).returncode
        except OSError as exc:
            raise StepFailedError(f"{name} failed: {exc}") from exc
        if returncode != 0:
            raise StepFailedError(f"{name} failed with exit code {returncode}")


def prepare(config: PrepareConfig, runner: Runner = subprocess.run, *, overwrite: bool = False) -> PreparedModel:
    """Prepare ``config.output``; raises PrepareError before changing anything, StepFailedError midway."""
    steps = plan(config, overwrite=overwrite)
    _check_programs(steps)
    run_steps(steps, runner)
    prepared = read_prepared(config.output.expanduser().absolute())
    if prepared is None:  # run_steps wrote it as its last step
        raise StepFailedError(f"{config.output / MANIFEST_NAME} is missing after a successful preparation")
    return prepared


# Command line -----------------------------------------------------------------------------------


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", metavar="SOURCE", help="Hugging Face model folder, or a Hub id.")
    parser.add_argument("output", nargs="?", metavar="OUTPUT", help="Folder to write; it must not exist or be empty.")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML or JSON config (source, output, tokenizer, weights, build); SOURCE, OUTPUT and the options "
        "below override it. An engine build (build:) is configured only there.",
    )
    parser.add_argument("--n-vocab-override", type=int, metavar="N", help="Logits width, if not the model's.")
    parser.add_argument(
        "--bos-token", metavar="TOKEN", help="Beginning-of-sequence token, if the tokenizer's is wrong."
    )
    parser.add_argument("--eos-token", metavar="TOKEN", help="End-of-sequence token, if the tokenizer's is wrong.")
    parser.add_argument(
        "--weights",
        choices=("link", "copy"),
        help="link (default): hardlink the checkpoint files, copying across filesystems; copy: always copy.",
    )
    parser.add_argument("--dry-run", action="store_true", help="Print the steps and change nothing.")
    parser.add_argument("--overwrite", action="store_true", help="Replace a previous preparation in OUTPUT.")


def config_from_arguments(arguments: argparse.Namespace) -> PrepareConfig:
    if arguments.config is None and (arguments.source is None or arguments.output is None):
        raise PrepareError("give SOURCE and OUTPUT, or --config FILE")
    raw: dict[str, Any] = {} if arguments.config is None else _read_config_file(arguments.config)
    for field in ("source", "output", "weights"):
        if getattr(arguments, field) is not None:
            raw[field] = getattr(arguments, field)
    tokenizer = {
        field: getattr(arguments, field)
        for field in TokenizerOverrides.model_fields
        if getattr(arguments, field) is not None
    }
    if tokenizer:
        file_tokenizer = raw.get("tokenizer")
        raw["tokenizer"] = {**file_tokenizer, **tokenizer} if isinstance(file_tokenizer, dict) else tokenizer
    origin = "arguments" if arguments.config is None else f"config file {arguments.config}"
    return validated(PrepareConfig, raw, origin)


def prepare_main(arguments: argparse.Namespace) -> int:
    """``llgtriton prepare``: 0 when prepared, 2 for a configuration problem, 1 when a step failed."""
    try:
        config = config_from_arguments(arguments)
        if arguments.dry_run:
            sys.stdout.write(_render_plan(plan(config, overwrite=arguments.overwrite)))
            return 0
        configure_logging("info")
        prepared = prepare(config, overwrite=arguments.overwrite)
    except PrepareError as exc:
        sys.stderr.write(f"llgtriton prepare: {exc}\n")
        return 2
    except StepFailedError as exc:
        sys.stderr.write(f"llgtriton prepare: {exc}; the output folder is incomplete (no {MANIFEST_NAME})\n")
        return 1
    except KeyboardInterrupt:
        return 130
    logger.info("prepared %s: serves the %s in %s", prepared.folder, prepared.manifest.serve, prepared.model_dir)
    return 0


def _render_plan(steps: Sequence[Step]) -> str:
    lines = [f"# llgtriton prepare: {len(steps)} steps (dry run: nothing was changed)"]
    for number, step in enumerate(steps, 1):
        lines.append(f"# {number}. {step.description}")
        if step.argv:
            lines.append(step.render())
    return "\n".join(lines) + "\n"
