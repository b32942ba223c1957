"""Chat messages to prompt tokens with the model's own Jinja template, or a template file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backend.errors import InvalidRequest
from backend.model_loader import ModelLoadError
from llgtriton.wire import ChatMessage


class ChatTemplate:
    def __init__(self, tokenizer: Any, override: Path | None = None) -> None:
        self._tokenizer = tokenizer
        self._template: str | None = None
        if override is not None:
            try:
                self._template = override.read_text(encoding="utf-8")
            except OSError as exc:
                raise ModelLoadError(f"cannot read chat template {override}: {exc}") from exc
        elif not getattr(tokenizer, "chat_template", None):
            raise ModelLoadError("the model has no chat template; pass one with --engine-chat-template")

    def render(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Prompt token ids for ``messages``, ending with the assistant generation prompt."""
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        try:
            ids = self._tokenizer.apply_chat_template(
                conversation,
                chat_template=self._template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        except Exception as exc:  # jinja2 raises TemplateError and raise_exception() messages
            raise InvalidRequest(f"the chat template rejected the messages: {exc}") from exc
        return [int(i) for i in ids]
