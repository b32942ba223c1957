"""A preparation as a list of steps (commands and Python actions), planned first and then run."""

from __future__ import annotations

import functools
import logging
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from launcher.prepare.arguments import CONVERT_CHECKPOINT, TRTLLM_BUILD
from launcher.prepare.config import BuildConfig, PrepareConfig
from launcher.prepare.files import (
    StepFailedError,
    check_engine,
    check_source,
    copy_tokenizer,
    download,
    locate_source,
    place_checkpoint,
    previous_entries,
    remove,
    write_manifest,
)
from llgtriton.prepared import (
    CHECKPOINT_DIR,
    ENGINE_DIR,
    MANIFEST_NAME,
    TOKENIZER_DIR,
    TRTLLM_CHECKPOINT_DIR,
    Manifest,
    PreparedModel,
    PrepareError,
    read_prepared,
)

logger = logging.getLogger(__name__)


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
    source = locate_source(config.source, output)
    if source.hub_id is None:
        check_source(source.folder, config.tokenizer)
    if config.build is not None:
        script = config.build.convert.script.expanduser()
        if not script.is_file():
            raise PrepareError(f"build.convert.script: {script} does not exist")
    steps: list[Step] = []
    previous = previous_entries(output, overwrite)
    if previous:
        steps.append(Step(f"remove the previous preparation from {output}", action=functools.partial(remove, previous)))
    if source.hub_id is not None:
        steps.append(
            Step(
                f"download {source.hub_id} from the Hugging Face Hub into {source.folder}",
                action=functools.partial(download, source.hub_id, source.folder, config.tokenizer),
            )
        )
    steps.append(
        Step(
            f"copy the tokenizer files into {output / TOKENIZER_DIR}",
            action=functools.partial(copy_tokenizer, source.folder, output / TOKENIZER_DIR),
        )
    )
    intermediates = [source.folder] if source.hub_id is not None else []
    if config.build is None:
        how: Literal["link", "copy", "move"] = "move" if source.hub_id is not None else config.weights
        steps.append(
            Step(
                f"{how} the checkpoint files into {output / CHECKPOINT_DIR}",
                action=functools.partial(place_checkpoint, source.folder, output / CHECKPOINT_DIR, how),
            )
        )
    else:
        steps += _build_steps(config.build, source.folder, output)
        intermediates.insert(0, output / TRTLLM_CHECKPOINT_DIR)
    if intermediates:
        steps.append(
            Step(
                f"remove the intermediate {', '.join(path.name for path in intermediates)}",
                action=functools.partial(remove, intermediates),
            )
        )
    manifest = Manifest(
        source=config.source, serve="checkpoint" if config.build is None else "engine", tokenizer=config.tokenizer
    )
    steps.append(Step(f"write {output / MANIFEST_NAME}", action=functools.partial(write_manifest, output, manifest)))
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
        Step(f"check the engine in {engine}", action=functools.partial(check_engine, engine)),
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
