"""A preparation's configuration: a TOML file and the command's arguments, validated in one place."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from launcher.prepare.arguments import CONVERT_CHECKPOINT, CONVERT_SET_BY_US, TRTLLM_BUILD, ArgValue, arguments_error
from llgtriton.prepared import FrozenModel, PrepareError, TokenizerOverrides, validated


class ConvertStep(FrozenModel):
    script: Path = Field(description="The model family's convert_checkpoint.py, e.g. examples/models/core/llama/...")
    args: dict[str, ArgValue] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list, description="Passed through unchecked, after args.")

    @field_validator("args", mode="before")
    @classmethod
    def _known_arguments(cls, value: object) -> object:
        if isinstance(value, Mapping) and (problems := CONVERT_CHECKPOINT.problems(value)):
            raise arguments_error(problems)
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
            raise arguments_error(problems)
        return value


class EngineBuildStep(FrozenModel):
    args: dict[str, ArgValue] = Field(default_factory=dict)

    @field_validator("args", mode="before")
    @classmethod
    def _known_arguments(cls, value: object) -> object:
        if isinstance(value, Mapping) and (problems := TRTLLM_BUILD.problems(value)):
            raise arguments_error(problems)
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


def read_config_file(path: Path) -> dict[str, Any]:
    """The TOML table of a config file (the one format of the ``llgtriton`` command)."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise PrepareError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise PrepareError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PrepareError(f"config file {path} is not valid TOML: {exc}") from None


def load_prepare_config(path: Path) -> PrepareConfig:
    """A prepare config from a TOML file; every problem in one PrepareError."""
    return validated(PrepareConfig, read_config_file(path), f"config file {path}")
