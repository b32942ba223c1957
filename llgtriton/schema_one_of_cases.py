"""``oneOf`` whose branches may overlap, written exactly as ``anyOf`` cases where the complements exist.

``oneOf: [B1, ..., Bn]`` holds where exactly one branch does, which is
``anyOf: [{allOf: [Bi, not Bj for every j != i]} for each i]``. A pair the proof of
:mod:`llgtriton.schema_one_of` shows disjoint needs no ``not`` (``Bi`` already excludes ``Bj``), so
only the pairs it cannot separate need a complement, and each must have an exact one
(:func:`llgtriton.schema_not.complement`, taken within ``Bi``: a ``$ref`` branch is read at its
local target; within a ``Bi`` of named values, ``not Bj`` is those values ``Bj`` rejects, judged as
the validator does by :mod:`llgtriton.schema_judge`). Where one does not, the ``oneOf`` is left as
it is and stays a 400 naming it; where every pair is disjoint, it is left for ``coerce_one_of``,
which is then exact.

The rewrite spends the proof's bounded budget: the pairs, and the size of every complement written.
"""

from __future__ import annotations

from typing import Any

from llgtriton.json_schemas import ANNOTATIONS, named_values, ref_chain, rewritten
from llgtriton.schema_not import complement
from llgtriton.schema_not_within import Budget, holds
from llgtriton.schema_one_of import MAX_SEARCH_COST, OneOfProof, ProofOverBudget
from llgtriton.schema_regex import TooCostly
from llgtriton.schema_values import NoExactComplement

_NOT_ASSERTING = ANNOTATIONS | {"$ref", "$defs", "definitions", "$schema", "$id", "id", "$anchor"}
# Keywords whose verdict depends on siblings: equal in both branches, or the difference is not read.
_READ_TOGETHER = (
    *("properties", "patternProperties", "additionalProperties", "items", "additionalItems", "prefixItems"),
    *("contains", "minContains", "maxContains", "if", "then", "else", "minimum", "maximum"),
    *("exclusiveMinimum", "exclusiveMaximum", "$dynamicAnchor", "$recursiveAnchor"),
)
_READS_ALL = frozenset({"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})


def one_of_as_cases(schema: Any) -> Any:
    """``schema`` with every overlapping ``oneOf`` whose complements are known written as ``anyOf``
    cases; the schema is not changed."""
    proof = OneOfProof(schema)
    try:
        return rewritten(schema, lambda node: _as_cases(node, proof))
    except ProofOverBudget:
        return schema


def _as_cases(node: dict[str, Any], proof: OneOfProof) -> dict[str, Any]:
    branches = node.get("oneOf")
    earlier = node.get("allOf", [])
    if not isinstance(branches, list) or not isinstance(earlier, list):
        return node
    overlapping = proof.overlapping(node)
    if not overlapping:
        return node
    others: dict[int, list[int]] = {index: [] for index in range(len(branches))}
    for first, second in overlapping:
        others[first].append(second)
        others[second].append(first)
    cases = []
    for index, branch in enumerate(branches):
        within = proof.resolve(branch)
        try:
            excluded = [_complement_within(proof, branches[other], within) for other in others[index]]
        except NoExactComplement:
            return node  # llguidance's refusal names the oneOf
        cases.append({"allOf": [branch, *excluded]} if excluded else branch)
    rest = {key: value for key, value in node.items() if key != "oneOf"}
    return {**rest, "allOf": [*earlier, {"anyOf": cases}]}


def _complement_within(proof: OneOfProof, branch: Any, within: Any) -> Any:
    target = _whole(proof, branch)
    proof.spend(_size(target))
    named = named_values(within)
    if named is not None:
        # Within a branch of finitely many values, the complement is those the other one rejects.
        budget = Budget(MAX_SEARCH_COST, proof.spend)
        try:
            kept = [value for value in named if not holds(value, target, budget)]
        except (NoExactComplement, TooCostly, RecursionError):
            kept = None
        if kept is not None:
            return {"enum": kept} if kept else False
    around = within if isinstance(within, dict) else None
    try:
        return complement(target, around, root=proof.root)
    except NoExactComplement:
        beyond = _beyond(within, target)
        if beyond is None:
            raise
        return complement(beyond, around, root=proof.root)


def _whole(proof: OneOfProof, branch: Any) -> Any:
    """``branch`` with its local ``$ref``s followed, and the keywords beside each kept: ``allOf`` of them."""
    chain = ref_chain(proof.root, branch)
    if chain is None or chain.target is None:
        raise NoExactComplement
    siblings = [kept for kept in (_asserting(beside) for beside in chain.beside) if kept]
    return {"allOf": [chain.target, *siblings]} if siblings else chain.target


def _asserting(schema: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key not in _NOT_ASSERTING}


def _beyond(within: Any, target: Any) -> dict[str, Any] | None:
    """What ``target`` asserts beyond ``within``, where every other keyword of ``target`` is in
    ``within`` as it is and judges alike there: then, for an instance ``within`` accepts, ``target``
    holds exactly where those keywords do. None where that is not shown: a keyword that reads its
    siblings (``additionalProperties`` reads ``properties``; ``unevaluatedProperties`` reads them
    all) differs, or either holds one that reads every other keyword."""
    if not (isinstance(within, dict) and isinstance(target, dict)):
        return None
    if (within.keys() | target.keys()) & _READS_ALL:
        return None
    beyond = {
        key: value
        for key, value in target.items()
        if key not in _NOT_ASSERTING and (key not in within or within[key] != value)
    }
    if any(within.get(key) != target.get(key) for key in _READ_TOGETHER):
        return None
    return beyond


def _size(schema: Any) -> int:
    """The objects and lists in ``schema``: what its complement writes out again."""
    if isinstance(schema, dict):
        return 1 + sum(_size(value) for value in schema.values())
    if isinstance(schema, list):
        return 1 + sum(_size(value) for value in schema)
    return 0
