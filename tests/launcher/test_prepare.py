"""``llgtriton prepare``: the output folder the backend reads, the engine build's commands, and its errors.

The engine build runs against a fake ``trtllm-build`` on PATH and a fake ``convert_checkpoint.py``:
small scripts that record their arguments and write what the real tools would.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.prepare import load_prepare_config
from llgtriton.prepared import MANIFEST_NAME, PrepareError, read_prepared

VOCAB = {"a": 0, "b": 1, "c": 2, "<s>": 3, "</s>": 4}
ADDED = [{"id": 4, "content": "</s>", "special": True}, {"id": 5, "content": "<|im_end|>", "special": True}]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"

FAKE_CONVERT = """\
import json, pathlib, sys
args = sys.argv[1:]
pathlib.Path({record!r}).write_text(json.dumps(args))
if {fail!r}:
    sys.exit(1)
out = pathlib.Path(args[args.index("--output_dir") + 1])
out.mkdir(parents=True)
(out / "config.json").write_text("{{}}")
(out / "rank0.safetensors").write_bytes(b"converted")
"""

FAKE_TRTLLM_BUILD = """\
#!{python}
import json, pathlib, sys
args = sys.argv[1:]
pathlib.Path({record!r}).write_text(json.dumps(args))
if not (pathlib.Path(args[args.index("--checkpoint_dir") + 1]) / "config.json").is_file():
    sys.exit(3)
out = pathlib.Path(args[args.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text("{{}}")
(out / "rank0.engine").write_bytes(b"engine")
"""


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """``prepare`` sets up the root logger for the terminal; the other tests get theirs back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _write_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 8}))
    tokenizer = {"model": {"type": "BPE", "vocab": VOCAB, "merges": []}, "added_tokens": ADDED}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "</s>"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 4}))
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    (folder / "pytorch_model.bin").write_bytes(b"the same weights in another format")
    (folder / ".cache").mkdir()
    (folder / "original").mkdir()
    (folder / "original" / "consolidated.00.pth").write_bytes(b"the weights in Meta's format")
    return folder


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return _write_model(tmp_path / "hf-model")


@dataclass(frozen=True)
class FakeTools:
    convert_script: Path
    convert_record: Path
    build_record: Path


def _fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, convert_fails: bool = False) -> FakeTools:
    tools = FakeTools(tmp_path / "convert_checkpoint.py", tmp_path / "convert.json", tmp_path / "build.json")
    tools.convert_script.write_text(FAKE_CONVERT.format(record=str(tools.convert_record), fail=convert_fails))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    trtllm_build = bin_dir / "trtllm-build"
    trtllm_build.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable, record=str(tools.build_record)))
    trtllm_build.chmod(trtllm_build.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tools


def _build_config(path: Path, model: Path, output: Path, script: Path, engine_args: str) -> Path:
    path.write_text(
        f"""\
source = {json.dumps(str(model))}
output = {json.dumps(str(output))}

[tokenizer]
eos_token = "<|im_end|>"

[build.convert]
script = {json.dumps(str(script))}
extra_args = ["--rotary_base", "500000"]

[build.convert.args]
dtype = "float16"
tp_size = 1
use_weight_only = true
weight_only_precision = "int8"
load_model_on_cpu = false

[build.engine.args]
{engine_args}
"""
    )
    return path


ENGINE_ARGS = """\
max_batch_size = 8
max_seq_len = 4096
gemm_plugin = "auto"
remove_input_padding = false
lora_plugin = false
gather_generation_logits = true
strip_plan = false
lora_target_modules = ["attn_q", "attn_k"]
"""


def test_prepare_links_the_checkpoint_and_writes_the_manifest(model: Path, tmp_path: Path) -> None:
    output = tmp_path / "prepared"

    assert main(["prepare", str(model), str(output), "--n-vocab-override", "64", "--eos-token", "<|im_end|>"]) == 0

    manifest = json.loads((output / MANIFEST_NAME).read_text())
    assert manifest == {
        "format": 1,
        "source": str(model),
        "serve": "checkpoint",
        "tokenizer": {"n_vocab_override": 64, "bos_token": None, "eos_token": "<|im_end|>"},
    }
    assert sorted(path.name for path in output.iterdir()) == ["checkpoint", MANIFEST_NAME, "tokenizer"]
    tokenizer_files = sorted(path.name for path in (output / "tokenizer").iterdir())
    assert tokenizer_files == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((output / "tokenizer" / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    # The checkpoint: the top-level files, safetensors without the other formats, nothing hidden or nested.
    checkpoint_files = sorted(path.name for path in (output / "checkpoint").iterdir())
    assert checkpoint_files == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (output / "checkpoint" / "model.safetensors").stat().st_ino == (model / "model.safetensors").stat().st_ino

    prepared = read_prepared(output)
    assert prepared is not None
    assert prepared.manifest.serve == "checkpoint"
    assert prepared.manifest.tokenizer.eos_token == "<|im_end|>"
    assert prepared.tokenizer_dir == output / "tokenizer"
    assert prepared.checkpoint_dir == prepared.model_dir == output / "checkpoint"
    assert prepared.engine_dir is None


def test_copy_mode_copies_the_weights(model: Path, tmp_path: Path) -> None:
    output = tmp_path / "prepared"

    assert main(["prepare", str(model), str(output), "--weights", "copy"]) == 0

    copied = output / "checkpoint" / "model.safetensors"
    assert copied.read_bytes() == (model / "model.safetensors").read_bytes()
    assert copied.stat().st_ino != (model / "model.safetensors").stat().st_ino


def test_engine_build_runs_the_converter_then_trtllm_build(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = _fake_tools(tmp_path, monkeypatch)
    output = tmp_path / "prepared"
    config = _build_config(tmp_path / "prepare.toml", model, output, tools.convert_script, ENGINE_ARGS)

    assert main(["prepare", "--config", str(config)]) == 0

    checkpoint = str(output / ".trtllm-checkpoint")
    assert json.loads(tools.convert_record.read_text()) == [
        "--model_dir", str(model), "--output_dir", checkpoint,
        "--dtype", "float16", "--tp_size", "1", "--use_weight_only", "--weight_only_precision", "int8",
        "--rotary_base", "500000",
    ]  # fmt: skip
    assert json.loads(tools.build_record.read_text()) == [
        "--checkpoint_dir", checkpoint, "--output_dir", str(output / "engine"),
        "--max_batch_size", "8", "--max_seq_len", "4096", "--gemm_plugin", "auto",
        "--remove_input_padding", "disable", "--lora_plugin", "disable", "--gather_generation_logits",
        "--lora_target_modules", "attn_q", "attn_k",
    ]  # fmt: skip
    assert sorted(path.name for path in output.iterdir()) == ["engine", MANIFEST_NAME, "tokenizer"]
    assert sorted(path.name for path in (output / "engine").iterdir()) == ["config.json", "rank0.engine"]
    prepared = read_prepared(output)
    assert prepared is not None
    assert prepared.manifest.serve == "engine"
    assert prepared.engine_dir == prepared.model_dir == output / "engine"
    assert prepared.checkpoint_dir is None


def test_a_misspelt_argument_is_refused_with_suggestions(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = _fake_tools(tmp_path, monkeypatch)
    output = tmp_path / "prepared"
    config = _build_config(tmp_path / "prepare.toml", model, output, tools.convert_script, "max_batch = 8\n")

    assert main(["prepare", "--config", str(config)]) == 2

    error = capsys.readouterr().err
    assert "build.engine.args: unknown trtllm-build argument 'max_batch'" in error
    assert "did you mean 'max_batch_size'" in error
    assert not output.exists()
    assert not tools.convert_record.exists()


def test_every_problem_of_a_config_file_is_listed_with_its_location(tmp_path: Path) -> None:
    config = tmp_path / "prepare.toml"
    config.write_text(
        """\
source = "model"
output = "out"
weights = "symlink"

[tokenizer]
n_vocab_override = 0

[build.convert]
script = "convert_checkpoint.py"
args = { model_dir = "x", use_weight_only = 1 }

[build.engine.args]
remove_input_padding = "off"
checkpoint_dir = "y"
"""
    )

    with pytest.raises(PrepareError) as error:
        load_prepare_config(config)

    message = str(error.value)
    assert "tokenizer.n_vocab_override: Input should be greater than or equal to 1" in message
    assert "weights: Input should be 'copy' or 'link'" in message
    assert "build.convert.args: 'model_dir' is set by llgtriton prepare" in message
    assert "build.convert.args: 'use_weight_only' takes true or false, not 1" in message
    assert "build.engine.args: 'remove_input_padding' takes true or false (or enable/disable), not \"off\"" in message
    assert "build.engine.args: 'checkpoint_dir' is set by llgtriton prepare" in message


def test_an_existing_output_is_replaced_only_with_overwrite(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "prepared"
    assert main(["prepare", str(model), str(output)]) == 0

    assert main(["prepare", str(model), str(output), "--weights", "copy"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert (output / "checkpoint" / "model.safetensors").stat().st_ino == (model / "model.safetensors").stat().st_ino

    assert main(["prepare", str(model), str(output), "--weights", "copy", "--overwrite"]) == 0
    assert (output / "checkpoint" / "model.safetensors").stat().st_ino != (model / "model.safetensors").stat().st_ino

    # --overwrite replaces a previous preparation, never a folder holding anything else.
    (output / "notes.txt").write_text("mine")
    assert main(["prepare", str(model), str(output), "--overwrite"]) == 2
    assert "did not write (notes.txt)" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "mine"
    assert (output / MANIFEST_NAME).exists()


def test_dry_run_prints_the_commands_and_changes_nothing(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = _fake_tools(tmp_path, monkeypatch)
    output = tmp_path / "prepared"
    config = _build_config(tmp_path / "prepare.toml", model, output, tools.convert_script, ENGINE_ARGS)

    assert main(["prepare", "--config", str(config), "--dry-run"]) == 0

    printed = capsys.readouterr().out
    assert f"{tools.convert_script} --model_dir {model} --output_dir {output / '.trtllm-checkpoint'}" in printed
    assert f"trtllm-build --checkpoint_dir {output / '.trtllm-checkpoint'} --output_dir {output / 'engine'}" in printed
    assert "--remove_input_padding disable" in printed
    assert f"# 6. write {output / MANIFEST_NAME}" in printed
    assert not output.exists()
    assert not tools.convert_record.exists()


def test_a_failing_step_is_named_and_no_manifest_is_written(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = _fake_tools(tmp_path, monkeypatch, convert_fails=True)
    output = tmp_path / "prepared"
    config = _build_config(tmp_path / "prepare.toml", model, output, tools.convert_script, ENGINE_ARGS)

    assert main(["prepare", "--config", str(config)]) == 1

    error = capsys.readouterr().err
    assert "step 2/6 (convert the checkpoint for TensorRT-LLM (convert_checkpoint.py)) failed with exit code 1" in error
    assert tools.convert_record.exists()
    assert not tools.build_record.exists()
    assert not (output / MANIFEST_NAME).exists()
    assert read_prepared(output) is None


def test_a_missing_trtllm_build_is_reported_before_anything_runs(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = _fake_tools(tmp_path, monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    output = tmp_path / "prepared"
    config = _build_config(tmp_path / "prepare.toml", model, output, tools.convert_script, ENGINE_ARGS)

    assert main(["prepare", "--config", str(config)]) == 2

    assert "trtllm-build is not on PATH" in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--n-vocab-override", "5"],
            "tokenizer.n_vocab_override 5 is smaller than the tokenizer's 6 token ids",
        ),
        (["--eos-token", "<|eot_id|>"], "tokenizer.eos_token '<|eot_id|>' is not a token of"),
    ],
)
def test_tokenizer_overrides_are_checked_against_the_vocabulary(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    output = tmp_path / "prepared"

    assert main(["prepare", str(model), str(output), *flags]) == 2

    assert message in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize(
    ("missing", "message"), [("config.json", "has no config.json"), ("tokenizer.json", "has no tokenizer")]
)
def test_a_source_without_config_or_tokenizer_is_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], missing: str, message: str
) -> None:
    (model / missing).unlink()

    assert main(["prepare", str(model), str(tmp_path / "prepared")]) == 2

    assert message in capsys.readouterr().err


def test_a_hub_id_is_downloaded_when_huggingface_hub_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    downloads: list[str] = []

    def snapshot_download(repo_id: str, *, local_dir: Path) -> str:
        downloads.append(repo_id)
        return str(_write_model(Path(local_dir)))

    hub = types.ModuleType("huggingface_hub")
    setattr(hub, "snapshot_download", snapshot_download)  # noqa: B010 (a module made here has no such attribute)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.chdir(tmp_path)

    assert main(["prepare", "org/tiny-model", "prepared"]) == 0

    assert downloads == ["org/tiny-model"]
    output = tmp_path / "prepared"
    assert sorted(path.name for path in output.iterdir()) == ["checkpoint", MANIFEST_NAME, "tokenizer"]
    assert (output / "checkpoint" / "model.safetensors").read_bytes() == b"weights" * 100
    prepared = read_prepared(output)
    assert prepared is not None
    assert prepared.manifest.source == "org/tiny-model"


def test_a_hub_id_without_huggingface_hub_asks_to_download_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import huggingface_hub now raises ImportError
    monkeypatch.chdir(tmp_path)

    assert main(["prepare", "org/tiny-model", "prepared"]) == 2

    assert (
        "SOURCE 'org/tiny-model' is not a directory; download it first "
        "(hf download org/tiny-model --local-dir DIR)" in capsys.readouterr().err
    )


def test_a_folder_without_manifest_is_not_prepared(model: Path) -> None:
    assert read_prepared(model) is None
    assert read_prepared(model / "model.safetensors") is None


@pytest.mark.parametrize("text", ["source: model\noutput: out\n", '{"source": "model", "output": "out"}'])
def test_a_config_that_is_not_toml_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """One config format for the whole command: YAML and JSON files get a clear error."""
    config = tmp_path / "prepare.yaml"
    config.write_text(text)

    assert main(["prepare", "--config", str(config)]) == 2

    assert f"config file {config} is not valid TOML" in capsys.readouterr().err
