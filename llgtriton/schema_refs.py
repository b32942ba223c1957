"""Local ``$ref``s that point outside the schema keywords, or into a keyword a rewrite replaces, moved into
``$defs`` so that the rewrites see them, and keep seeing them.

A ``$ref`` may name any location of the document, such as a root key of the schema's own
(``{"$ref": "#/colorString"}`` beside ``"colorString": {...}``). The rewrites walk only the
keywords that hold schemas (:mod:`llgtriton.json_schemas`), so a schema kept at such a location was
never rewritten, while llguidance, which follows the ``$ref``, read it as it was: an unasserted
``format`` there was refused as a whole. Each such target is copied into ``$defs`` and its ``$ref``s
point at the copy (one copy of a place, however its ``$ref``s spell it, and at most
:data:`MAX_COPIED_BYTES` of copies, past which the schema is left as it was); the document otherwise
stays as it is, so the schema means the same.

A ``$ref`` into a keyword that a rewrite replaces (``{"$ref": "#/allOf/1/not/not"}``: a ``not`` becomes
its complement, a ``oneOf`` its cases) would point at nothing after it; its target is copied the same
way, before any rewrite, so that it names the schema it named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llgtriton.json_schemas import local_target, placed_subschemas, pointer_parts, refs, rewritten

_NAME = "llgtriton-ref-{}"
# Keywords whose schemas the rewrites replace or move (schema_not, schema_not_within, schema_one_of_cases,
# schema_dependencies, schema_property_names): a $ref through one of them is moved to a copy. A property
# of one of these names is copied too, needlessly but exactly.
_REWRITTEN = frozenset(
    {"not", "oneOf", "if", "then", "else", "dependencies", "dependentSchemas", "dependentRequired", "propertyNames"}
)
# The copies may add at most this many bytes to the schema, so that a request cannot make a schema many
# times its own size (a $ref to every level of a deep target copies each level).
MAX_COPIED_BYTES = 1 << 20

Path = tuple[str, ...]


def stray_refs_into_defs(schema: Any) -> Any:
    """``schema`` with every local ``$ref`` whose target lies outside the schema keywords pointing at a
    copy of that target in ``$defs``; ``schema`` is not changed."""
    if not isinstance(schema, dict) or not isinstance(schema.get("$defs", {}), dict):
        return schema
    places = set(_schema_paths(schema, ()))
    moved: dict[str, str] = {}  # a stray $ref -> the one that replaces it
    named: dict[Path, str] = {}  # a stray target's place -> its copy's name (one copy however it is spelled)
    copies: dict[str, Any] = {}
    copied_bytes = 0
    waiting = [schema]
    while waiting:
        for ref in _local_refs(waiting.pop()):
            if ref in moved:
                continue
            path = pointer_parts(ref)
            target = local_target(schema, ref)
            kept_in_place = path in places and not _REWRITTEN.intersection(path or ())
            if path is None or kept_in_place or not isinstance(target, dict | bool):
                continue
            if path not in named:
                copied_bytes += len(json.dumps(target))
                if copied_bytes > MAX_COPIED_BYTES:
                    return schema  # (left as it was: llguidance follows the $refs itself)
                named[path] = _NAME.format(len(copies))
                copies[named[path]] = target
                if isinstance(target, dict):
                    waiting.append(target)  # (its own $refs may stray too)
            moved[ref] = f"#/$defs/{named[path]}"
    if not moved:
        return schema

    def repointed(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return {**node, "$ref": moved[ref]} if isinstance(ref, str) and ref in moved else node

    defs = {**schema.get("$defs", {}), **{name: rewritten(copy, repointed) for name, copy in copies.items()}}
    return {**rewritten(schema, repointed), "$defs": defs}


def _schema_paths(node: Any, path: Path) -> Iterator[Path]:
    """The paths of ``node`` and of every schema inside it, through the schema keywords."""
    yield path
    for place, inner in placed_subschemas(node):
        yield from _schema_paths(inner, (*path, *place))


def _local_refs(node: Any) -> Iterator[str]:
    """The local ``$ref``s of ``node`` and of the schemas inside it."""
    return (ref for ref in refs(node) if isinstance(ref, str) and ref.startswith("#"))
