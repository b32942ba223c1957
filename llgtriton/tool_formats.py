"""Tool calls in each model family's own format: how they are written, constrained and read back.

Both sides share it. The backend renders the tools into the model's chat template, or describes
them in a system message when the template has no tools section, and constrains the output to
the family's call syntax. The proxy reads the calls back out of the text, by the format the
backend names in its first response.

- ``generic``: ``<tool_call>`` and a JSON list of ``{"name", "arguments"}`` objects (ours, for
  templates without a tools section).
- ``hermes`` (Qwen 2.5/3, Hermes): each call is ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>``.
- ``llama3_json`` (Llama 3.1-3.3): each call is a bare ``{"name", "parameters"}`` object, several
  separated by ``; ``, after ``<|python_tag|>`` where the model writes it.
- ``mistral``: ``[TOOL_CALLS]`` and a JSON list of ``{"name", "arguments"}`` objects, forced or not.

Under ``auto`` the output is text, which never holds the trigger, then calls from the trigger on,
or text alone; a format whose trigger is the call's own first character (``llama3_json``) answers
in text or calls from the start. Where the model's tokenizer has a tag as a special token
(``[TOOL_CALLS]``, Qwen's ``<tool_call>``), the grammar names the token, which no spelled-out text
matches, and the backend's detokenizer writes it into the text for the proxy to read.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llgtriton.guides import JSON_OPTIONS, lark_text, with_json_options
from llgtriton.tools import Function, PastCall, ToolMode, ToolRequest


@dataclass(frozen=True)
class ToolCallFormat:
    """One family's call syntax.

    ``listed``: the calls sit in one JSON list after ``trigger``. Otherwise each call is a JSON
    object written as ``opener`` + object + ``closer``, calls separated by ``separator``; under
    ``auto`` the calls begin with ``trigger``, which is the opener's start (or, when the opener is
    empty, the object's own ``{``). ``arguments_key`` names the arguments.

    ``marker``: a special token the model may write just before its calls (allowed where its
    tokenizer has it). ``always_triggered``: the calls begin with the trigger even when forced.
    ``call_id_length``: the family's templates take only call ids of this many letters and digits.
    """

    name: str
    trigger: str
    listed: bool
    opener: str = ""
    closer: str = ""
    separator: str = ""
    arguments_key: str = "arguments"
    marker: str = ""
    always_triggered: bool = False
    call_id_length: int = 0

    @property
    def tags(self) -> tuple[str, ...]:
        """The texts the format writes that a tokenizer may have as special tokens."""
        tags = (self.trigger, self.opener.strip(), self.closer.strip(), self.marker)
        return tuple(dict.fromkeys(tag for tag in tags if tag))

    def template_call_id(self, call_id: str | None) -> str | None:
        """``call_id`` as the family's templates take it: another id maps to one of the right shape,
        the same every time, so a call and its result still match."""
        size = self.call_id_length
        if not size or call_id is None or (len(call_id) == size and call_id.isascii() and call_id.isalnum()):
            return call_id
        alphabet = string.ascii_letters + string.digits
        return "".join(alphabet[byte % len(alphabet)] for byte in hashlib.sha256(call_id.encode()).digest()[:size])

    @property
    def trigger_is_call(self) -> bool:
        """Whether the trigger is part of the first call's text (a reader must keep it)."""
        return not self.listed and not self.opener

    def write(self, calls: Sequence[PastCall]) -> str:
        """Earlier calls as the model writes them (for templates that cannot render them)."""
        objects = [{"name": c.name, self.arguments_key: c.parsed_arguments()} for c in calls]
        if self.listed:
            return self.trigger + json.dumps(objects, ensure_ascii=False)
        return self.separator.join(f"{self.opener}{json.dumps(o, ensure_ascii=False)}{self.closer}" for o in objects)

    def grammar(
        self, tools: ToolRequest, answer_schema: str | None = None, special: Mapping[str, int] | None = None
    ) -> str:
        """The Lark grammar of an output under ``tools``; ``answer_schema`` (JSON text) is what a
        plain answer must be under ``auto`` (None: free text); ``special``: the tokenizer's special
        tokens among :attr:`tags`, by their text."""
        special = special or {}
        if tools.mode is ToolMode.NAMED:
            return "start: args\nargs: %json " + _json(tools.functions[0].parameters)
        marker = f"{lark_text(self.marker, special)}? " if self.marker in special else ""
        if self.listed:
            schema = _calls_schema(tools.functions, tools.parallel, self.arguments_key)
            triggered = tools.mode is ToolMode.AUTO or self.always_triggered
            calls = f"calls: {marker}{lark_text(self.trigger, special) + ' ' if triggered else ''}list\n"
            calls += f"list: %json {_json(schema)}"
        else:
            calls = f"calls: {marker}{self._series('call', tools)}\ncall: {self._call(self.opener, special)}\n"
            calls += f"object: %json {_json(_call_schema(tools.functions, self.arguments_key))}"
        if tools.mode is ToolMode.REQUIRED:
            return f"start: calls\n{calls}"
        if answer_schema is not None:
            return f"start: calls | answer\nanswer: %json {_json(json.loads(answer_schema))}\n{calls}"
        if self.trigger_is_call:  # (text that began like a call would be one): calls from the start only
            return f"start: calls | TEXT\nTEXT: /[^{_regex(self.trigger[0])}](.|\\n)*/\n{calls}"
        # Text alone, which never holds the trigger (not even spelled out, where it is a special
        # token); or text up to the trigger, then the calls' rest. A trigger in text is where a
        # lexeme stops, the trigger included; a special token simply ends the text.
        without = f"/(.|\\n)*/ & ~/(.|\\n)*{_regex(self.trigger)}(.|\\n)*/"
        if self.trigger in special:
            lead = f"calls_start: TEXT? {lark_text(self.trigger, special)}"
        else:
            lead = f"calls_start[stop={json.dumps(self.trigger)}]: /(.|\\n)*/"
        rest = self._calls_rest(tools, special)
        return f"start: TEXT | calls_start calls_rest\nTEXT: {without}\n{lead}\n{rest}\n{calls}"

    def _calls_rest(self, tools: ToolRequest, special: Mapping[str, int]) -> str:
        """The calls after their trigger."""
        if self.listed:
            return "calls_rest: list"
        return f"calls_rest: {self._series(self._call(self.opener[len(self.trigger) :], special), tools)}"

    def _call(self, opener: str, special: Mapping[str, int]) -> str:
        """A call's rule body: ``opener``, the call's object, the closer."""
        parts = (lark_text(opener, special), "object", lark_text(self.closer, special))
        return " ".join(part for part in parts if part)

    def _series(self, first: str, tools: ToolRequest) -> str:
        """``first``, then (when parallel) more calls, each after the separator."""
        return first + (f" ({json.dumps(self.separator)} call)*" if tools.parallel else "")

    def instructions(self, tools: ToolRequest, json_answer: bool = False) -> str:
        """The tools described in a system message, for templates without a tools section
        (``json_answer``: a plain answer must be JSON)."""
        listed = [{"name": f.name, "description": f.description, "parameters": f.parameters} for f in tools.functions]
        described = "You can call these functions:\n" + json.dumps(listed, ensure_ascii=False)
        if tools.mode is ToolMode.NAMED:
            return f"{described}\nReply with the JSON arguments for {tools.functions[0].name}."
        call = f'{{"name": <function name>, "{self.arguments_key}": {{...}}}}'
        if self.listed and tools.mode is ToolMode.REQUIRED and not self.always_triggered:  # the list alone
            how = f"a JSON list of calls, each {call}"
        elif self.listed:
            how = f"{self.trigger} followed by a JSON list of calls, each {call}"
        else:
            written = " ".join(part for part in (self.opener.strip(), call, self.closer.strip()) if part)
            how = f"each call as {written}, separated by {json.dumps(self.separator)}"
        if tools.mode is ToolMode.REQUIRED:
            return f"{described}\nReply with {how}."
        otherwise = "otherwise reply with the JSON answer" if json_answer else "otherwise reply normally"
        return f"{described}\nTo call functions, reply with {how}; {otherwise}."


FORMATS: dict[str, ToolCallFormat] = {
    "generic": ToolCallFormat("generic", "<tool_call>", listed=True),
    "hermes": ToolCallFormat(
        "hermes", "<tool_call>", listed=False, opener="<tool_call>\n", closer="\n</tool_call>", separator="\n"
    ),
    # Llama 3.1-3.3's JSON tool calling: a bare object whose arguments are "parameters".
    "llama3_json": ToolCallFormat(
        "llama3_json", "{", listed=False, separator="; ", arguments_key="parameters", marker="<|python_tag|>"
    ),
    # Mistral's models write the trigger before forced calls too; their templates take 9-character ids.
    "mistral": ToolCallFormat("mistral", "[TOOL_CALLS]", listed=True, always_triggered=True, call_id_length=9),
}


def detect_format(template: str | None) -> ToolCallFormat:
    """The family a chat template's tools section writes calls in; ``generic`` when it has none."""
    if not renders_tools(template):
        return FORMATS["generic"]
    assert template is not None
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "<|python_tag|>" in template or ("<|eom_id|>" in template and '"parameters"' in template):
        return FORMATS["llama3_json"]
    return FORMATS["generic"]


def renders_tools(template: str | None) -> bool:
    """Whether a chat template has a tools section (it reads the ``tools`` variable)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def _regex(text: str) -> str:
    """``text`` as a literal in a Lark regex (Rust syntax)."""
    return "".join(f"\\{char}" if char in "\\.+*?()|[]{}^$/-&~" else char for char in text)


def _json(schema: Any) -> str:
    """A schema for ``%json``, written with the server's JSON layout (bounded whitespace)."""
    return json.dumps(with_json_options(schema, JSON_OPTIONS))


def _rooted(node: Any, root: str) -> Any:
    """``node`` with every local ``$ref`` ("#...") moved under the JSON pointer ``root``."""
    if isinstance(node, list):
        return [_rooted(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    moved = {key: _rooted(value, root) for key, value in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        moved["$ref"] = "#" + root + ref[1:]
    return moved


def _call_schema(functions: Sequence[Function], arguments_key: str) -> dict[str, Any]:
    """One call: an object naming a function and holding its arguments.

    Each function's schema sits whole under ``$defs/fn<i>``, its references rewritten to point
    there: pydantic's ``$defs``, older ``definitions`` and ``#`` itself still resolve, and two
    functions' definitions of the same name do not collide.
    """
    definitions = {
        f"fn{index}": {k: v for k, v in _rooted(f.parameters, f"/$defs/fn{index}").items() if k != "$schema"}
        for index, f in enumerate(functions)
    }
    choices = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, arguments_key: {"$ref": f"#/$defs/fn{index}"}},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for index, f in enumerate(functions)
    ]
    return {"$defs": definitions, "anyOf": choices}


def _calls_schema(functions: Sequence[Function], parallel: bool, arguments_key: str) -> dict[str, Any]:
    """A JSON list of calls (one when not ``parallel``)."""
    call = _call_schema(functions, arguments_key)
    schema: dict[str, Any] = {"$defs": call.pop("$defs"), "type": "array", "items": call, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema
