"""Which mask process keeps a request: new grammars spread by load as they are compiled, a grammar's
requests kept where it is compiled while that child is not much busier, and a dead child passed over."""

from __future__ import annotations

from dataclasses import dataclass

from backend.mask_placement import IMBALANCE, Placement


@dataclass(eq=False)
class Child:
    index: int
    load: int = 0
    up: bool = True

    def alive(self) -> bool:
        return self.up


def children(count: int) -> list[Child]:
    return [Child(index) for index in range(count)]


def admit(placement: Placement[Child], kids: list[Child], grammar: str) -> Child:
    """As the mask process adds a request: its reservation, else a choice."""
    child = placement.claim(grammar)
    if child is None:
        child = placement.choose(kids, grammar)
        placement.count(child, 1)
        placement.place(grammar, child)
    return child


def test_a_wave_of_new_grammars_is_spread_evenly_while_it_compiles() -> None:
    """256 grammars compiled ahead before any request is admitted: 64 a child, and each request then
    goes where its grammar was compiled."""
    placement: Placement[Child] = Placement()
    kids = children(4)
    compiled = {}
    for number in range(256):
        grammar = f"grammar {number}"
        compiled[grammar] = placement.choose(kids, grammar)
        placement.reserve(grammar, compiled[grammar])
    assert [kid.load for kid in kids] == [64] * 4
    for grammar, child in compiled.items():
        assert admit(placement, kids, grammar) is child
    assert [kid.load for kid in kids] == [64] * 4


def test_one_grammar_for_every_request_spreads_over_every_child_once_each_has_compiled_it() -> None:
    placement: Placement[Child] = Placement()
    kids = children(4)
    first = placement.choose(kids, "shared")
    placement.reserve("shared", first)
    admit(placement, kids, "shared")
    for _ in range(255):
        admit(placement, kids, "shared")
    loads = [kid.load for kid in kids]
    assert sum(loads) == 256 and max(loads) - min(loads) <= IMBALANCE + 1


def test_a_request_stays_with_its_grammar_until_that_child_is_too_busy() -> None:
    placement: Placement[Child] = Placement()
    kids = children(2)
    placement.place("rare", kids[0])
    kids[0].load = IMBALANCE
    assert placement.choose(kids, "rare") is kids[0]  # compiled there, busier by IMBALANCE
    kids[0].load = IMBALANCE + 1
    assert placement.choose(kids, "rare") is kids[1]  # now the least busy one compiles it too


def test_a_dead_child_is_passed_over_and_forgotten_once_replaced() -> None:
    placement: Placement[Child] = Placement()
    kids = children(2)
    placement.place("g", kids[0])
    kids[0].up = False
    assert all(placement.choose(kids, "g") is kids[1] for _ in range(4))
    kids[0] = Child(0)  # its replacement has compiled nothing
    placement.forget([0])
    kids[1].load = 1
    assert placement.choose(kids, "g") is kids[0]  # (the least busy: "g" is placed nowhere now)


def test_a_reservation_whose_compile_failed_is_let_go() -> None:
    placement: Placement[Child] = Placement()
    kids = children(2)
    placement.reserve("bad", kids[0])
    assert kids[0].load == 1
    placement.release("bad", kids[0])
    assert kids[0].load == 0 and placement.claim("bad") is None
