"""Which of several mask processes keeps a constrained request (``backend.mask_process``).

A step's rows are computed side by side only as far as the children share them, so requests are
spread by load; and a child compiles a grammar it has not seen on its step thread, which holds up
every row it keeps, so a request goes where its grammar is compiled already while that child is
not much busier than the least busy one. A grammar compiled ahead for a request (``prepare``) is
reserved there and counted in that child's load until the request arrives: a wave of new grammars
is spread over the children as it is compiled, not only once it runs.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import Generic, Protocol, TypeVar

# A request goes to a child that has its grammar unless that one keeps this many more requests than
# the least busy one (which then compiles it, once).
IMBALANCE = 2
_KEPT = 4096  # grammars whose children are remembered, and grammars reserved for a request to come


class Keeper(Protocol):
    """A child as the placement sees it."""

    index: int  # its place among the children (a child that replaces another takes its place)
    load: int  # the requests it keeps, and those reserved for it

    def alive(self) -> bool: ...


K = TypeVar("K", bound=Keeper)


class Placement(Generic[K]):
    """The children that compiled each grammar, and the reservations; safe from several threads."""

    def __init__(self) -> None:
        # By the grammar's hash: a collision only places a request less well.
        self._places: OrderedDict[int, set[int]] = OrderedDict()
        self._reserved: OrderedDict[int, deque[K]] = OrderedDict()
        self._turns = itertools.count()  # whom a tie between children goes to, in turn
        self._lock = threading.Lock()

    def choose(self, children: Sequence[K], grammar: str) -> K:
        """The child for a request of ``grammar``: the least busy one that has compiled it, unless it
        keeps more than :data:`IMBALANCE` requests over the least busy child; that one else (in turn
        among equals). Children that are down are passed over while one is up."""
        if len(children) == 1:
            return children[0]
        turn = next(self._turns) % len(children)
        ordered = [*children[turn:], *children[:turn]]
        up = [child for child in ordered if child.alive()] or ordered

        def load(child: K) -> int:
            return child.load

        least = min(up, key=load)
        with self._lock:
            places = self._places.get(hash(grammar))
            if places:
                near = min((child for child in up if child.index in places), key=load, default=None)
                if near is not None and near.load <= least.load + IMBALANCE:
                    return near
        return least

    def place(self, grammar: str, child: K) -> None:
        """``child`` has compiled ``grammar``, or will have before it reads a request's next message."""
        key = hash(grammar)
        with self._lock:
            places = self._places.get(key)
            if places is None:
                places = self._places[key] = set()
                if len(self._places) > _KEPT:
                    self._places.popitem(last=False)
            else:
                self._places.move_to_end(key)
            places.add(child.index)

    def count(self, child: K, requests: int) -> None:
        """``child`` keeps ``requests`` more (fewer, if negative): under the lock that reservations,
        made on the compile threads, change its load under too."""
        with self._lock:
            child.load += requests

    def reserve(self, grammar: str, child: K) -> None:
        """``child`` compiles ``grammar`` for a request to come, which :meth:`claim` then gives it."""
        self.place(grammar, child)
        with self._lock:
            child.load += 1
            self._reserved.setdefault(hash(grammar), deque()).append(child)
            if len(self._reserved) > _KEPT:  # (requests that never came: their load is let go)
                for forgotten in self._reserved.popitem(last=False)[1]:
                    forgotten.load -= 1

    def claim(self, grammar: str) -> K | None:
        """The child the oldest reservation of ``grammar`` is for (its load now the request's), or None."""
        if not self._reserved:
            return None
        key = hash(grammar)
        with self._lock:
            waiting = self._reserved.get(key)
            if not waiting:
                return None
            claimed = waiting.popleft()
            if not waiting:
                del self._reserved[key]
            return claimed

    def release(self, grammar: str, child: K) -> None:
        """No request comes for ``child``'s reservation of ``grammar`` (its compile failed)."""
        key = hash(grammar)
        with self._lock:
            waiting = self._reserved.get(key)
            if waiting and child in waiting:
                waiting.remove(child)
                child.load -= 1
                if not waiting:
                    del self._reserved[key]

    def forget(self, indices: Iterable[int]) -> None:
        """The children at ``indices`` are replaced: what they had compiled is gone with them."""
        gone = set(indices)
        with self._lock:
            for places in self._places.values():
                places.difference_update(gone)
