"""--print-config says what the auto tool-call and reasoning parsers will pick, read from the template."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher import cli
from launcher.formats import AT_LOAD, auto_parsers
from llgtriton.settings import EngineSettings

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"


@pytest.mark.parametrize(
    ("template", "tools", "reasoning"),
    [
        ("hermes.jinja", "hermes", "none"),
        ("llama3_json.jinja", "llama3_json", "none"),
        ("r1_thinking.jinja", "generic", "deepseek_r1"),
        ("qwen3_thinking.jinja", "generic", "qwen3"),
    ],
)
def test_a_template_file_says_what_auto_picks(template: str, tools: str, reasoning: str) -> None:
    lines = auto_parsers(EngineSettings(chat_template=TEMPLATES / template))
    assert lines == [
        f"# engine.tool_call_parser = auto: {tools}, from the chat template {TEMPLATES / template}",
        f"# engine.reasoning_parser = auto: {reasoning}, from the chat template {TEMPLATES / template}",
    ]


def test_a_local_model_folders_tokenizer_config_is_read(tmp_path: Path) -> None:
    template = (TEMPLATES / "hermes.jinja").read_text()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (line,) = auto_parsers(EngineSettings(model=str(tmp_path), reasoning_parser="none"))
    assert line.startswith("# engine.tool_call_parser = auto: hermes, from the chat template ")


def test_a_model_only_its_loading_reveals_is_decided_at_load() -> None:
    assert auto_parsers(EngineSettings()) == [
        f"# engine.tool_call_parser = auto: {AT_LOAD}",
        f"# engine.reasoning_parser = auto: {AT_LOAD}",
    ]
    assert auto_parsers(EngineSettings(tool_call_parser="hermes", reasoning_parser="none")) == []


def test_print_config_shows_the_pick_and_stays_a_valid_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [name for name in os.environ if name.startswith("LLGTRITON_")]:  # cli.main reads them
        monkeypatch.delenv(name)
    argv = ["serve", "--print-config", f"--engine-chat-template={TEMPLATES / 'hermes.jinja'}"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "# engine.tool_call_parser = auto: hermes, from the chat template" in printed
    config = tmp_path / "printed.toml"
    config.write_text(printed)
    assert cli.main(["serve", "--config", str(config), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
