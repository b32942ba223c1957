"""``llgtriton prepare``'s arguments and its entry point."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.prepare.config import PrepareConfig, read_config_file
from launcher.prepare.files import StepFailedError
from launcher.prepare.plan import Step, plan, prepare
from llgtriton.logs import configure_logging
from llgtriton.prepared import MANIFEST_NAME, PrepareError, TokenizerOverrides, validated

logger = logging.getLogger(__name__)


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", metavar="SOURCE", help="Hugging Face model folder, or a Hub id.")
    parser.add_argument("output", nargs="?", metavar="OUTPUT", help="Folder to write; it must not exist or be empty.")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML config (source, output, weights, [tokenizer], [build.convert], [build.engine]); SOURCE, "
        "OUTPUT and the options below override it. An engine build ([build]) is configured only there.",
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
    raw: dict[str, Any] = {} if arguments.config is None else read_config_file(arguments.config)
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
