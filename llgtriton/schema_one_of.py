"""``oneOf`` served exactly where no instance can match two of its branches.

``oneOf`` asks that exactly one branch match; llguidance refuses it unless told to read it as
``anyOf`` (its ``coerce_one_of``), which also accepts an instance that matches several. Where
every pair of branches is provably disjoint the two are the same, so the schema compiles with
that option and nothing is approximated. Two branches are disjoint here when

- the JSON types they admit do not meet (``integer`` counts as a ``number``), or
- both admit only objects, and a property both require has a ``const``/``enum`` in each whose
  values do not meet (a discriminator), or one requires a property the other forbids;
- both admit only strings, and no string is found by both patterns (their automata explored side
  by side, :func:`llgtriton.schema_regex.disjoint`; literal prefixes or suffixes that differ are
  the quick case);
- one admits only named values (``const``/``enum``) none of which the other accepts, judged as the
  validator does (:func:`llgtriton.schema_judge.satisfies`, or
  :func:`llgtriton.schema_not_within.holds` for a branch of ``anyOf``/``allOf``/``not`` such as the
  complement a ``not`` is rewritten to).

Anything else (patterns, ``required``-only branches, ``allOf``, remote ``$ref``s) is not proven,
and the schema stays a 400 naming ``oneOf``. ``$ref``s to the schema's own parts are followed; a
branch's ``$ref`` is read alone (older drafts ignore its siblings), which only ever proves less.

The proof's work is bounded (:data:`WORK_BUDGET`): a ``oneOf`` of thousands of branches fits in a
constraint's megabyte, and comparing them pairwise would hold a compile thread for minutes. Past the
budget nothing is proven, and the schema is refused as it was without the proof.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from llgtriton.json_schemas import ref_chain, subschemas
from llgtriton.schema_judge import PatternSearch, judged_alone, literal_prefix, literal_suffix, satisfies
from llgtriton.schema_not_within import Budget, holds
from llgtriton.schema_regex import TooCostly, compile_work, disjoint
from llgtriton.schema_values import NoExactComplement

_TYPES = frozenset({"null", "boolean", "object", "array", "string", "number"})
_MAX_NESTING = 4  # subschemas read into for a branch's types, and properties compared within properties
# Branch pairs compared plus the names and values looked at, for a whole schema: far above real
# schemas (the largest oneOf of JSONSchemaBench's shared set takes a few hundred), about 0.1 s.
WORK_BUDGET = 100_000
MAX_SEARCH_COST = WORK_BUDGET // 2  # one pattern search's bound, past which its proof is not tried


class ProofOverBudget(Exception):
    """The proof spent :data:`WORK_BUDGET`; nothing more is proven for the schema."""


@dataclass(frozen=True)
class _Branch:
    """What the proof reads of one branch, worked out once."""

    types: frozenset[str]  # the JSON types it may admit (more, never fewer)
    required: frozenset[str]
    values: dict[str, frozenset[str]]  # of its required properties with a const/enum: the values, as JSON
    forbidden: frozenset[str]  # properties it declares false
    declared: frozenset[str]  # properties it declares
    closed: bool  # no property beyond the declared ones (additionalProperties false, no patterns)
    prefix: str | None = None  # what its anchored pattern's strings start with
    suffix: str | None = None  # what they end with
    named: tuple[Any, ...] | None = None  # the only values it admits (const, enum)
    simple: dict[str, Any] | None = None  # the branch, where values.satisfies can judge a value by it
    required_schemas: tuple[tuple[str, Any], ...] = ()  # of its required properties: their schemas
    pattern: str | None = None
    schema: Any = None  # the branch itself, its $refs followed
    property_schemas: tuple[tuple[str, Any], ...] = ()  # of every property it declares: its schema


class OneOfProof:
    """Which branches of a schema's ``oneOf``s may overlap, within one :data:`WORK_BUDGET`."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._left = WORK_BUDGET
        # Keyed by id, holding the object too: a freed schema's id could come back for another.
        self._branches: dict[int, tuple[Any, _Branch | None]] = {}
        self._nesting = 0
        self._types: dict[tuple[int, int], tuple[Any, frozenset[str]]] = {}
        self.searcher = PatternSearch(self.spend)

    @property
    def root(self) -> Any:
        """The schema whose ``oneOf``s the proof reads."""
        return self._root

    def spend(self, work: int) -> None:
        self._left -= work
        if self._left < 0:
            raise ProofOverBudget

    def resolve(self, schema: Any) -> Any:
        """``schema`` with its local ``$ref``s followed (None for one that cannot be)."""
        return _resolve(self._root, schema)

    def branch(self, schema: Any) -> _Branch | None:
        resolved = _resolve(self._root, schema)
        if id(resolved) not in self._branches:
            self._branches[id(resolved)] = (resolved, self._read(resolved))
        return self._branches[id(resolved)][1]

    def overlapping(self, node: dict[str, Any]) -> list[tuple[int, int]]:
        """The pairs of ``node``'s ``oneOf`` branches not proven disjoint (raises :class:`ProofOverBudget`)."""
        branches = node.get("oneOf")
        if not isinstance(branches, list):
            return []
        within = self.types(node)  # the oneOf's own schema admits only these
        read = [self.branch(branch) for branch in branches]
        return [
            (index, later)
            for index, first in enumerate(read)
            for later in range(index + 1, len(read))
            if not self.disjoint(first, read[later], within)
        ]

    def _read(self, schema: Any) -> _Branch | None:
        if schema is None:
            return None
        if not isinstance(schema, dict):
            return _Branch(_types(schema), frozenset(), {}, frozenset(), frozenset(), False)
        required = _required(schema)
        declared = schema.get("properties")
        properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
        self.spend(len(required) + len(properties))
        values = {}
        for name in required & properties.keys():
            item = _resolve(self._root, properties[name])
            self.spend(_named_count(item))  # before writing them out: an enum may be long
            named = _values(item)
            if named is not None:
                values[name] = named
        forbidden = frozenset(name for name, item in properties.items() if _resolve(self._root, item) is False)
        closed = schema.get("additionalProperties") is False and not schema.get("patternProperties")
        admitted = _named(schema)
        self.spend(len(admitted or ()))
        return _Branch(
            self.types(schema),
            required,
            values,
            forbidden,
            frozenset(properties),
            closed,
            literal_prefix(schema.get("pattern")),
            literal_suffix(schema.get("pattern")),
            admitted,
            schema if judged_alone(schema) else None,
            tuple((name, properties[name]) for name in sorted(required & properties.keys())),
            schema.get("pattern") if isinstance(schema.get("pattern"), str) else None,
            schema,
            tuple(properties.items()),
        )

    def types(self, schema: Any, nesting: int = 0) -> frozenset[str]:
        """The JSON types ``schema`` may admit (more, never fewer), read through its ``allOf`` (each
        holds), ``anyOf`` and ``oneOf`` (one branch holds) and local ``$ref``s, a few levels deep."""
        key = (id(schema), nesting)
        if key not in self._types:
            self._types[key] = (schema, self._read_types(schema, nesting))
        return self._types[key][1]

    def _read_types(self, schema: Any, nesting: int) -> frozenset[str]:
        self.spend(1)
        found = _types(schema)
        if not isinstance(schema, dict) or nesting >= _MAX_NESTING:
            return found
        if isinstance(schema.get("$ref"), str):
            target = _resolve(self._root, schema)
            if target is None:
                return found
            found &= self.types(target, nesting + 1)
        for entry in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            found &= self.types(entry, nesting + 1)
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                found &= frozenset().union(*(self.types(branch, nesting + 1) for branch in branches))
        return found

    def disjoint(self, first: _Branch | None, second: _Branch | None, within: frozenset[str] = _TYPES) -> bool:
        self.spend(1)
        if first is None or second is None:
            return False
        if not first.types & second.types & within:
            return True
        if (first.types | second.types) & within <= {"string"} and (
            _prefixes_differ(first.prefix, second.prefix)
            or _suffixes_differ(first.suffix, second.suffix)
            or self._patterns_apart(first.pattern, second.pattern)
        ):
            return True
        if _apart_by_values(self, first, second) or _apart_by_values(self, second, first):
            return True
        objects = frozenset({"object"})
        if not (first.types & within <= objects and second.types & within <= objects):
            return False
        return (
            _discriminated(self, first, second)
            or _forbids(self, first, second)
            or _forbids(self, second, first)
            or self._apart_by_a_property(first, second)
        )

    def _patterns_apart(self, first: str | None, second: str | None) -> bool:
        """No string is found by both patterns (:func:`llgtriton.schema_regex.disjoint`), proven within
        :data:`MAX_SEARCH_COST` steps."""
        if first is None or second is None:
            return False
        (mine, work), (theirs, more) = compile_work(first), compile_work(second)
        self.spend(work + more)
        if mine is None or theirs is None:
            return False
        try:
            return disjoint(mine, theirs, self.searcher.capped())
        except TooCostly:
            return False

    def _apart_by_a_property(self, first: _Branch, second: _Branch) -> bool:
        """One requires a property the other declares, and their schemas for it are disjoint (read a
        few levels deep at most): an object both accept holds it, and its value would match both."""
        if self._nesting >= _MAX_NESTING:
            return False
        self._nesting += 1
        try:
            return self._required_apart(first, second) or self._required_apart(second, first)
        finally:
            self._nesting -= 1

    def _required_apart(self, first: _Branch, second: _Branch) -> bool:
        theirs = dict(second.property_schemas)
        self.spend(len(first.required_schemas))
        return any(
            name in theirs and self.disjoint(self.branch(schema), self.branch(theirs[name]))
            for name, schema in first.required_schemas
        )


def every_one_of_is_disjoint(root: Any) -> bool:
    """Whether ``root`` has a ``oneOf`` and every ``oneOf`` in it has pairwise disjoint branches,
    proven within :data:`WORK_BUDGET`."""
    proof, found = OneOfProof(root), False
    try:
        for node in _schemas(root):
            if not isinstance(node.get("oneOf"), list):
                continue
            found = True
            if proof.overlapping(node):
                return False
    except ProofOverBudget:
        return False
    return found


def _schemas(root: Any) -> Iterator[dict[str, Any]]:
    pending, seen = [root], set()
    while pending:
        node = pending.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        pending.extend(subschemas(node))


def _resolve(root: Any, schema: Any) -> Any:
    """``schema`` with its local ``$ref``s followed (None for one that cannot be); the keywords beside
    them only narrow it, which a proof that branches are apart may leave out."""
    chain = ref_chain(root, schema)
    return None if chain is None else chain.target


def _types(schema: Any) -> frozenset[str]:
    """The JSON types ``schema`` may admit (more, never fewer)."""
    if schema is False:
        return frozenset()
    if not isinstance(schema, dict):
        return _TYPES
    declared = schema.get("type")
    if isinstance(declared, str):
        declared = [declared]
    if isinstance(declared, list) and all(isinstance(name, str) for name in declared):
        return frozenset("number" if name == "integer" else name for name in declared) & _TYPES
    if "const" in schema:
        return frozenset({_type_of(schema["const"])})
    if isinstance(schema.get("enum"), list):
        return frozenset(_type_of(value) for value in schema["enum"])
    return _TYPES


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _required(schema: dict[str, Any]) -> frozenset[str]:
    required = schema.get("required")
    return frozenset(name for name in required if isinstance(name, str)) if isinstance(required, list) else frozenset()


def _values(schema: Any) -> frozenset[str] | None:
    """The values ``schema`` allows, as canonical JSON, when it names them (``const``, ``enum``)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return frozenset({json.dumps(schema["const"], sort_keys=True)})
    if isinstance(schema.get("enum"), list):
        return frozenset(json.dumps(value, sort_keys=True) for value in schema["enum"])
    return None


def _named_count(schema: Any) -> int:
    """How many values ``schema`` names with ``const`` or ``enum``."""
    if not isinstance(schema, dict):
        return 0
    if "const" in schema:
        return 1
    enum = schema.get("enum")
    return len(enum) if isinstance(enum, list) else 0


def _discriminated(proof: OneOfProof, first: _Branch, second: _Branch) -> bool:
    """A property both require whose named values do not meet."""
    common = first.values.keys() & second.values.keys()
    proof.spend(len(common))
    for name in common:
        mine, theirs = first.values[name], second.values[name]
        proof.spend(min(len(mine), len(theirs)))
        if not mine & theirs:
            return True
    return False


def _forbids(proof: OneOfProof, first: _Branch, second: _Branch) -> bool:
    """``first`` requires a property ``second`` forbids (declares false, or leaves out while closed)."""
    proof.spend(len(first.required))
    return any(name in second.forbidden or (second.closed and name not in second.declared) for name in first.required)


def _named(schema: dict[str, Any]) -> tuple[Any, ...] | None:
    if "const" in schema:
        return (schema["const"],)
    enum = schema.get("enum")
    return tuple(enum) if isinstance(enum, list) else None


def _apart_by_values(proof: OneOfProof, first: _Branch, second: _Branch) -> bool:
    """``first`` admits only values that ``second`` rejects, each judged as the validator does
    (:func:`llgtriton.schema_judge.satisfies`, or :func:`llgtriton.schema_not_within.holds` for a
    branch of ``allOf``/``anyOf``/``not``, objects or arrays)."""
    if first.named is None:
        return False
    try:
        if second.simple is not None:
            return not any(satisfies(value, second.simple, proof.searcher) for value in first.named)
        budget = Budget(MAX_SEARCH_COST, proof.spend)
        return not any(holds(value, second.schema, budget) for value in first.named)
    except (TooCostly, NoExactComplement, RecursionError):
        return False  # not proven


def _suffixes_differ(first: str | None, second: str | None) -> bool:
    """No string ends with both, a final newline aside (neither ends the other, and neither holds one)."""
    if first is None or second is None:
        return False
    length = min(len(first), len(second))
    return first[len(first) - length :] != second[len(second) - length :]


def _prefixes_differ(first: str | None, second: str | None) -> bool:
    """No string starts with both (neither is a prefix of the other)."""
    if first is None or second is None:
        return False
    length = min(len(first), len(second))
    return first[:length] != second[:length]
