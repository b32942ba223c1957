"""Chat messages to prompt tokens with the model's own Jinja template, or a template file.

Tools go through the template's own tools section when it has one, and calls the assistant made
earlier as structured ``tool_calls``. A template without one gets the tools described in a system
message and earlier calls written as the model writes them (``llgtriton.tool_formats``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backend.errors import InvalidRequest
from backend.guidance_tokenizer import control_tokens
from backend.model_loader import ModelLoadError
from llgtriton.guides import short
from llgtriton.messages import ChatMessage
from llgtriton.reasoning import REASONING_FORMATS, ReasoningFormat, detect_reasoning
from llgtriton.reasoning import TAGS as REASONING_TAGS
from llgtriton.tool_formats import FORMATS, ToolCallFormat, detect_format, renders_tools
from llgtriton.tools import ToolRequest

logger = logging.getLogger(__name__)


class ChatTemplate:
    def __init__(
        self,
        tokenizer: Any,
        override: Path | None = None,
        tool_call_parser: str = "auto",
        reasoning_parser: str = "auto",
    ) -> None:
        self._tokenizer = tokenizer
        self._template: str | None = None
        if override is not None:
            try:
                self._template = override.read_text(encoding="utf-8")
            except OSError as exc:
                raise ModelLoadError(f"cannot read chat template {override}: {exc}") from exc
        elif not getattr(tokenizer, "chat_template", None):
            raise ModelLoadError("the model has no chat template; pass one with --engine-chat-template")
        source = self._template or _template_text(tokenizer.chat_template)
        if tool_call_parser == "auto":
            self.tool_format = detect_format(source)
            logger.info("tool calls: %s format, detected from the chat template", self.tool_format.name)
        else:
            self.tool_format = FORMATS[tool_call_parser]
        # Our own format is the fallback's: a template that knows tools writes them its own way.
        self.renders_tools = renders_tools(source) and self.tool_format.name != "generic"
        self.reasoning: ReasoningFormat | None = None
        if reasoning_parser == "auto":
            self.reasoning = detect_reasoning(source, self._generation_prompt())
            if self.reasoning is not None:
                logger.info("reasoning: %s format, detected from the chat template", self.reasoning.name)
        elif reasoning_parser != "none":
            self.reasoning = REASONING_FORMATS[reasoning_parser]
        # The formats' tags that are special tokens here: grammars must name the tokens themselves.
        tags = (*self.tool_format.tags, *(REASONING_TAGS if self.reasoning is not None else ()))
        self.special_tokens = special_token_ids(tokenizer, tags)
        self._sanitize = client_text_stays_text(tokenizer)
        if self.special_tokens:
            logger.info("special tokens in the output formats: %s", self.special_tokens)

    def _generation_prompt(self) -> str:
        """What the template writes for the assistant to begin, after one user message (text)."""
        try:
            text = self._tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}],
                chat_template=self._template,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception:  # a template that refuses this conversation: nothing to detect from
            return ""
        return str(text)

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolRequest | None = None,
        *,
        json_answer: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Prompt token ids for ``messages``, ending with the assistant generation prompt (``tools``: what
        the answer may call; ``json_answer``: a plain answer must be JSON; ``template_kwargs``: the
        request's variables for the template, such as ``enable_thinking``)."""
        # OpenAI's developer messages are what chat templates, which do not know that role, call system.
        messages = [dataclasses.replace(m, role="system") if m.role == "developer" else m for m in messages]
        if self.renders_tools:
            conversation = [_native(m, self.tool_format) for m in messages]
            extra: dict[str, Any] = {"tools": tools.openai_tools()} if tools is not None else {}
        else:
            described = _described(messages, tools, self.tool_format, json_answer)
            conversation = [{"role": m.role, "content": m.content} for m in described]
            extra = {}
        try:
            ids = self._tokenizer.apply_chat_template(
                conversation,
                chat_template=self._template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **self._sanitize,
                **{**(template_kwargs or {}), **extra},
            )
        except Exception as exc:  # jinja2 raises TemplateError and raise_exception() messages
            raise InvalidRequest(f"the chat template rejected the messages: {short(str(exc))}") from None
        return [int(i) for i in ids]


def client_text_stays_text(tokenizer: Any) -> dict[str, bool]:
    """``apply_chat_template``'s option that encodes the control tokens a client's strings spell
    (``<|im_end|>`` in a message, a tool result or description) as text, so only the template's own
    are tokens: no content can close its turn and forge a system one. Older transformers lack it."""
    if "sanitize_control_tokens" in inspect.signature(tokenizer.apply_chat_template).parameters:
        return {"sanitize_control_tokens": True}
    logger.warning(
        "transformers %s cannot keep client text from becoming control tokens (5.24 can): a message that "
        "spells one can forge a turn",
        getattr(importlib.import_module("transformers"), "__version__", "?"),
    )
    return {}


def _template_text(template: Any) -> str:
    """A tokenizer's template; several named ones (``{"default": ..., "tool_use": ...}``) read as one."""
    if isinstance(template, dict):
        return "\n".join(str(value) for value in template.values())
    return str(template or "")


def special_token_ids(tokenizer: Any, texts: Sequence[str]) -> dict[str, int]:
    """Those of ``texts`` that are each one control token of ``tokenizer`` (no text is read as one), with their ids."""
    control = control_tokens(tokenizer)
    return {text: control[text] for text in texts if text in control}


def _native(message: ChatMessage, form: ToolCallFormat) -> dict[str, Any]:
    """A message as templates with a tools section take it (arguments as objects, as transformers
    documents; call ids as the family's templates accept them)."""
    value: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        value["tool_calls"] = [
            {
                "id": form.template_call_id(c.id),
                "type": "function",
                "function": {"name": c.name, "arguments": c.parsed_arguments()},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        value["tool_call_id"] = form.template_call_id(message.tool_call_id)
    return value


def _described(
    messages: Sequence[ChatMessage], tools: ToolRequest | None, form: ToolCallFormat, json_answer: bool
) -> list[ChatMessage]:
    """The fallback: earlier calls written into their messages, the tools described in the system message."""
    written = [
        dataclasses.replace(m, content=m.content + form.write(m.tool_calls), tool_calls=()) if m.tool_calls else m
        for m in messages
    ]
    if tools is None:
        return written
    instructions = form.instructions(tools, json_answer)
    if written and written[0].role == "system":
        first = written[0]
        return [dataclasses.replace(first, content=f"{instructions}\n\n{first.content}"), *written[1:]]
    return [ChatMessage(role="system", content=instructions), *written]
