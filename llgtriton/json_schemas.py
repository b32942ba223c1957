"""Reading a JSON schema: the keywords that hold subschemas, and the targets of its local ``$ref``s."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Keywords whose value is one schema, a list of schemas, or a map of names to schemas. Values of
# every other keyword (enum, const, default, examples, required ...) are data.
ONE_SCHEMA = frozenset(
    {
        "items",
        "additionalItems",
        "additionalProperties",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "contentSchema",
    }
)
# Keywords that judge nothing.
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


def subschemas(schema: Any) -> Iterator[Any]:
    """The schemas directly inside ``schema`` (not through its ``$ref``s)."""
    for _, inner in placed_subschemas(schema):
        yield inner


def placed_subschemas(schema: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The schemas directly inside ``schema``, each with its place there (the JSON pointer's parts)."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, inner in value.items():
                yield (key, name), inner
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for index, inner in enumerate(value):
                yield (key, str(index)), inner
        elif key in ONE_SCHEMA:
            yield (key,), value


def refs(schema: Any) -> Iterator[Any]:
    """Every ``$ref`` value of ``schema`` and of the schemas inside it (not through the ``$ref``s), of any type."""
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        yield schema["$ref"]
    for inner in subschemas(schema):
        yield from refs(inner)


def pointer_parts(ref: str) -> tuple[str, ...] | None:
    """The decoded parts of a local JSON pointer (``#/...``; ``#`` is the root, and so is a ``#name``
    anchor, which this does not resolve); None for a ``$ref`` to another document."""
    if not ref.startswith("#"):
        return None
    return tuple(urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~") for raw in ref[1:].split("/")[1:])


def named_values(schema: Any) -> list[Any] | None:
    """The values a ``const`` or an ``enum`` of ``schema`` names (``const`` first), or None."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else None


def local_target(root: Any, ref: str) -> Any:
    """The part of ``root`` a ``#/...`` JSON pointer names, or None."""
    parts = pointer_parts(ref)
    if parts is None:
        return None
    node = root
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


@dataclass(frozen=True)
class RefChain:
    """Where a schema's chain of local ``$ref``s ends, and the keywords beside each ``$ref`` on the
    way: from draft 2019-09 on they apply too (older drafts' are dropped before the rewrites)."""

    target: Any
    beside: tuple[dict[str, Any], ...]


MAX_REF_CHAIN = 32  # a chain of local $refs this long is taken for a cycle


def ref_chain(root: Any, schema: Any, most: int = MAX_REF_CHAIN) -> RefChain | None:
    """``schema``'s chain of fewer than ``most`` local ``$ref``s into ``root``, followed; None where
    one leads nowhere or the chain is longer (a cycle)."""
    beside: list[dict[str, Any]] = []
    for _ in range(most):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return RefChain(schema, tuple(beside))
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        if siblings:
            beside.append(siblings)
        schema = local_target(root, schema["$ref"])
        if schema is None:
            return None
    return None


def rewritten(schema: Any, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``schema`` with ``rewrite`` applied to every schema object in it, innermost first; data (``enum``,
    ``const``, ``default`` ...) and property names are left as they are, and ``schema`` is not changed."""
    if not isinstance(schema, dict):
        return schema
    return rewrite({key: _rewritten_value(key, value, rewrite) for key, value in schema.items()})


def _rewritten_value(key: str, value: Any, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    if key in SCHEMA_MAPS and isinstance(value, dict):
        return {name: rewritten(item, rewrite) for name, item in value.items()}
    if key in SCHEMA_LISTS and isinstance(value, list):
        return [rewritten(item, rewrite) for item in value]
    if key in ONE_SCHEMA:
        return rewritten(value, rewrite)
    return value
