"""What ``auto`` tool-call and reasoning parsers will pick, for ``--print-config``.

The backend decides when the model loads (and logs it), from the template it renders with. Here
the same detection reads the template without loading the model: ``--engine-chat-template``, or
a local model folder's ``chat_template.jinja`` / ``tokenizer_config.json``. A model whose template
only its loading reveals (the embedded GGUF, a hub id) is said to be decided at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llgtriton.reasoning import detect_reasoning
from llgtriton.settings import EngineSettings
from llgtriton.tool_formats import detect_format

AT_LOAD = "decided when the model loads (the log says which)"


def chat_template_text(settings: EngineSettings) -> tuple[str, str] | None:
    """The template the backend will render with, and where it was read; None when only loading tells."""
    if settings.chat_template is not None:
        return _read(settings.chat_template), str(settings.chat_template)
    folder = Path(settings.model)
    if not folder.is_dir():
        return None
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return _read(jinja), str(jinja)
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template: Any = json.loads(_read(config)).get("chat_template")
        if isinstance(template, list):  # several named templates: [{"name", "template"}]
            template = "\n".join(str(entry.get("template", "")) for entry in template if isinstance(entry, dict))
        if isinstance(template, str) and template:
            return template, str(config)
    return None


def auto_parsers(settings: EngineSettings) -> list[str]:
    """TOML comments saying what each ``auto`` parser resolves to (nothing when none is ``auto``)."""
    automatic = [name for name in ("tool_call_parser", "reasoning_parser") if getattr(settings, name) == "auto"]
    if not automatic:
        return []
    found = chat_template_text(settings)
    if found is None:
        return [f"# engine.{name} = auto: {AT_LOAD}" for name in automatic]
    template, source = found
    picked = {
        "tool_call_parser": detect_format(template).name,
        "reasoning_parser": getattr(detect_reasoning(template, _generation_prompt(template)), "name", "none"),
    }
    return [f"# engine.{name} = auto: {picked[name]}, from the chat template {source}" for name in automatic]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _generation_prompt(template: str) -> str:
    """What ``template`` writes for the assistant to begin after one user message ("" if it cannot tell)."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # a transformers dependency

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        messages = [{"role": "user", "content": "x"}]
        rendered = environment.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token="", eos_token=""
        )
    except Exception:  # jinja2 absent, or a template that needs what only transformers provides
        return ""
    return str(rendered)
