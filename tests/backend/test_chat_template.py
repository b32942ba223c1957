"""Chat templates: the model's own by default, a file when configured, clear errors otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend.chat_template import ChatTemplate
from backend.errors import InvalidRequest
from backend.model_loader import ModelLoadError
from llgtriton.wire import ChatMessage

MESSAGES = (ChatMessage(role="user", content="Hello"),)


def test_model_template_is_the_default(tokenizer: Any) -> None:
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids = ChatTemplate(tokenizer).render(MESSAGES)
    assert ids == list(expected)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_template_file_overrides_the_model(tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] ")
    ids = ChatTemplate(tokenizer, path).render(MESSAGES)
    assert tokenizer.decode(ids) == "[user] Hello\n[assistant] "


def test_template_errors_are_invalid_requests(tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "strict.jinja"
    path.write_text(
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system message must come first') }}{% endif %}"
    )
    with pytest.raises(InvalidRequest, match="a system message must come first"):
        ChatTemplate(tokenizer, path).render(MESSAGES)


def test_missing_template_file_is_a_load_error(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot read chat template"):
        ChatTemplate(tokenizer, tmp_path / "missing.jinja")
