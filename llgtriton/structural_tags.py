"""Structural tags, as vLLM, SGLang and TensorRT-LLM accept them (``response_format: {"type":
"structural_tag", "structures": [...], "triggers": [...]}``): free text in which each trigger opens
one of the structures that begin with it (its ``begin`` text, JSON matching its ``schema``, its
``end`` text), after which free text goes on. Text outside the structures never holds a trigger.

This module reads the document and lays the grammar out; ``llgtriton.guides`` gives each schema
the server's exact JSON treatment.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_STRUCTURES = 256


@dataclass(frozen=True)
class Structure:
    begin: str
    schema: dict[str, Any] | bool
    end: str


@dataclass(frozen=True)
class StructuralTag:
    structures: tuple[Structure, ...]
    triggers: tuple[str, ...]

    @classmethod
    def parse(cls, document: Any) -> StructuralTag:
        """Raises ``ValueError`` saying what is wrong with ``document``."""
        if not isinstance(document, dict):
            raise ValueError("a structural tag is an object with structures and triggers")
        structures, triggers = document.get("structures"), document.get("triggers")
        if not isinstance(structures, list) or not 1 <= len(structures) <= MAX_STRUCTURES:
            raise ValueError(f"a structural tag needs 1 to {MAX_STRUCTURES} structures")
        if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise ValueError("a structural tag needs triggers: a list of non-empty strings")
        parsed = tuple(_structure(index, value) for index, value in enumerate(structures))
        for index, structure in enumerate(parsed):
            if not any(structure.begin.startswith(trigger) for trigger in triggers):
                raise ValueError(f"structures[{index}].begin {structure.begin!r} starts with none of the triggers")
        return cls(parsed, tuple(dict.fromkeys(triggers)))

    def lark(self, json_body: Callable[[dict[str, Any] | bool], str]) -> str:
        """The Lark grammar; ``json_body(schema)`` is what follows ``%json`` for a structure's schema.

        Each trigger has a rule: text that ends at its first trigger, which is this one (a lazy
        lexeme), then the rest of one of the structures that begin with it. The text after the last
        structure holds no trigger at all.
        """
        anywhere = "|".join(_regex(trigger) for trigger in self.triggers)
        no_trigger = f"~/(.|\\n)*({anywhere})(.|\\n)*/"
        lines = [
            f"start: segment* TAIL?\nTAIL: /(.|\\n)+/ & {no_trigger}",
            "segment: " + " | ".join(f"opened_{index}" for index in range(len(self.triggers))),
        ]
        for index, trigger in enumerate(self.triggers):
            # Up to and including this trigger, with no trigger ending before it does.
            before = f"~/(.|\\n)*({anywhere})(.|\\n)+/"
            lines.append(f"opened_{index}: lead_{index} ({' | '.join(self._rests(index, trigger))})")
            lines.append(f"lead_{index}[lazy]: /(.|\\n)*{_regex(trigger)}/ & {before}")
        for index, structure in enumerate(self.structures):
            lines.append(f"schema_{index}: %json {json_body(structure.schema)}")
        return "\n".join(lines)

    def _rests(self, trigger_index: int, trigger: str) -> list[str]:
        rests = []
        for index, structure in enumerate(self.structures):
            if structure.begin.startswith(trigger):
                rest = structure.begin[len(trigger) :]
                parts = [json.dumps(rest)] if rest else []
                parts += [f"schema_{index}", json.dumps(structure.end)] if structure.end else [f"schema_{index}"]
                rests.append(" ".join(parts))
        return rests


def _structure(index: int, value: Any) -> Structure:
    where = f"structures[{index}]"
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object with begin, schema and end")
    begin, end = value.get("begin"), value.get("end", "")
    schema = value.get("schema", value.get("parameters", True))
    if not isinstance(begin, str) or not begin:
        raise ValueError(f"{where}.begin must be a non-empty string")
    if not isinstance(end, str):
        raise ValueError(f"{where}.end must be a string")
    if not isinstance(schema, dict | bool):
        raise ValueError(f"{where}.schema must be a JSON schema (an object or a boolean)")
    return Structure(begin, schema, end)


def _regex(text: str) -> str:
    """``text`` as a literal in a Lark regex (Rust syntax)."""
    return "".join(f"\\{char}" if char in "\\.+*?()|[]{}^$/-&~" else char for char in text)
