"""Patterns read as automata: a search whose cost is counted, and two patterns no string matches both.

The ``jsonschema`` validator judges ``pattern`` with Python's ``re.search``, which backtracks: its
time has no useful bound in the pattern's size. For the patterns that are regular here (characters,
classes, ``\\d``/``\\w``/``\\s``, groups, alternation, repeats, ``^``, ``$``, ``\\A``, ``\\Z``; no
flags, lookarounds, backreferences, word boundaries, possessive repeats or atomic groups) the same
question, "does some substring match", is answered by simulating the pattern's automaton on every
start position at once (Thompson's construction): each step is counted, at most the program's size
per character, and the caller's budget pays for it. Whether a match exists does not depend on the
order in which a backtracking engine tries the choices (greedy or lazy) for these constructs, so the
answer is ``re.search``'s. Each character is tested as ``re`` tests it: a literal or range by code
point, a category (``\\d``, ``\\w``, ``\\s``) by ``re`` itself on that one character.

:func:`disjoint` explores the two automata side by side (their product) over every string, and
proves that none reaches both matches; a pair of character tests whose common character cannot be
shown not to exist (two categories, say) is taken to meet, which only ever proves less.
"""

from __future__ import annotations

import functools
import re
import re._constants as sre  # type: ignore[import-not-found]  # re's own parser: what re.search reads
import re._parser as sre_parse  # type: ignore[import-not-found]
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_PROGRAM = 20_000  # instructions one pattern may expand to (a repeat is written out)
MAX_FINITE = 256  # characters a class may list and still be enumerated
_ALLOWED_FLAGS = sre.SRE_FLAG_UNICODE | sre.SRE_FLAG_VERBOSE  # VERBOSE changes only the parsing
_CATEGORIES = {
    sre.CATEGORY_DIGIT: re.compile(r"\d"),
    sre.CATEGORY_NOT_DIGIT: re.compile(r"\D"),
    sre.CATEGORY_SPACE: re.compile(r"\s"),
    sre.CATEGORY_NOT_SPACE: re.compile(r"\S"),
    sre.CATEGORY_WORD: re.compile(r"\w"),
    sre.CATEGORY_NOT_WORD: re.compile(r"\W"),
}
_BEGIN = "begin"  # ^ and \A: only at the string's start (no MULTILINE flag)
_END = "end"  # $: at the end, or before a final newline
_END_STRING = "end-string"  # \Z: at the end only


class Unsupported(Exception):
    """The pattern holds a construct read here only by ``re`` itself."""


class TooCostly(Exception):
    """The search or proof spent the steps it was allowed."""


@dataclass(frozen=True)
class CharTest:
    """One character's test: ``test`` as ``re`` judges; ``finite``: every character it accepts,
    where they are few (None: too many, or not known)."""

    test: Callable[[str], bool]
    finite: frozenset[str] | None


# An instruction: ("char", CharTest), ("split", a, b), ("jmp", a), ("assert", kind), ("match",).
Instruction = tuple[Any, ...]


@dataclass(frozen=True)
class Program:
    code: tuple[Instruction, ...]

    def __len__(self) -> int:
        return len(self.code)


def compiled(pattern: str) -> Program:
    """``pattern`` as an automaton program; raises :class:`Unsupported`."""
    program, _work = compile_work(pattern)
    if program is None:
        raise Unsupported
    return program


@functools.lru_cache(maxsize=512)
def compile_work(pattern: str) -> tuple[Program | None, int]:
    """``pattern``'s program (None where it is not read here) and the work of reading it: its
    characters and the instructions written, at most :data:`MAX_PROGRAM`."""
    if len(pattern) > MAX_PROGRAM:
        return None, 1
    builder = _Builder()
    try:
        parsed = sre_parse.parse(pattern)
        if parsed.state.flags & ~_ALLOWED_FLAGS:
            raise Unsupported
        builder.sequence(parsed)
        builder.emit(("match",))
    except (Unsupported, re.error, RecursionError, OverflowError):
        return None, len(pattern) + len(builder.code)
    return Program(tuple(builder.code)), len(pattern) + len(builder.code)


class _Builder:
    def __init__(self) -> None:
        self.code: list[Any] = []

    def emit(self, instruction: Any) -> int:
        if len(self.code) >= MAX_PROGRAM:
            raise Unsupported
        self.code.append(instruction)
        return len(self.code) - 1

    def sequence(self, items: Any) -> None:
        for op, av in items:
            self.item(op, av)

    def item(self, op: Any, av: Any) -> None:
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            self.emit(("char", _char_test(op, av)))
        elif op is sre.AT:
            kinds = {
                sre.AT_BEGINNING: _BEGIN,
                sre.AT_BEGINNING_STRING: _BEGIN,
                sre.AT_END: _END,
                sre.AT_END_STRING: _END_STRING,
            }
            if av not in kinds:
                raise Unsupported  # word boundaries
            self.emit(("assert", kinds[av]))
        elif op is sre.SUBPATTERN:
            _group, add_flags, del_flags, inner = av
            if add_flags or del_flags:
                raise Unsupported
            self.sequence(inner)
        elif op is sre.BRANCH:
            self.branch(av[1])
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            self.repeat(*av)
        else:
            raise Unsupported  # lookarounds, backreferences, possessive repeats, atomic groups

    def branch(self, alternatives: list[Any]) -> None:
        jumps = []
        for index, alternative in enumerate(alternatives):
            if index < len(alternatives) - 1:
                split = self.emit(None)
                self.sequence(alternative)
                jumps.append(self.emit(None))
                self.code[split] = ("split", split + 1, len(self.code))
            else:
                self.sequence(alternative)
        for jump in jumps:
            self.code[jump] = ("jmp", len(self.code))

    def repeat(self, low: int, high: int, inner: Any) -> None:
        for _ in range(low):
            self.sequence(inner)
        if high is sre.MAXREPEAT:
            split = self.emit(None)
            self.sequence(inner)
            self.emit(("jmp", split))
            self.code[split] = ("split", split + 1, len(self.code))
            return
        splits = []
        for _ in range(high - low):
            splits.append(self.emit(None))
            self.sequence(inner)
        for split in splits:
            self.code[split] = ("split", split + 1, len(self.code))


def _char_test(op: Any, av: Any) -> CharTest:
    if op is sre.LITERAL:
        char = chr(av)
        return CharTest(char.__eq__, frozenset({char}))
    if op is sre.NOT_LITERAL:
        char = chr(av)
        return CharTest(char.__ne__, None)
    if op is sre.ANY:
        return CharTest("\n".__ne__, None)
    negated = False
    tests: list[Callable[[str], bool]] = []
    finite: set[str] | None = set()
    for kind, value in av:
        if kind is sre.NEGATE:
            negated = True
        elif kind is sre.LITERAL:
            tests.append(chr(value).__eq__)
            if finite is not None:
                finite.add(chr(value))
        elif kind is sre.RANGE:
            low, high = value
            tests.append(functools.partial(_in_range, low, high))
            if finite is not None and high - low < MAX_FINITE:
                finite.update(map(chr, range(low, high + 1)))
            else:
                finite = None
        elif kind is sre.CATEGORY and value in _CATEGORIES:
            tests.append(functools.partial(_in_category, _CATEGORIES[value]))
            finite = None
        else:
            raise Unsupported
    if finite is not None and len(finite) > MAX_FINITE:
        finite = None
    if negated:
        return CharTest(functools.partial(_none_of, tuple(tests)), None)
    return CharTest(functools.partial(_any_of, tuple(tests)), frozenset(finite) if finite is not None else None)


def _in_range(low: int, high: int, char: str) -> bool:
    return low <= ord(char) <= high


def _in_category(category: re.Pattern[str], char: str) -> bool:
    return category.fullmatch(char) is not None


def _any_of(tests: tuple[Callable[[str], bool], ...], char: str) -> bool:
    return any(test(char) for test in tests)


def _none_of(tests: tuple[Callable[[str], bool], ...], char: str) -> bool:
    return not any(test(char) for test in tests)


def _holds(kind: str, text: str, position: int) -> bool:
    if kind == _BEGIN:
        return position == 0
    if kind == _END:
        return position == len(text) or (position == len(text) - 1 and text[position] == "\n")
    return position == len(text)


def search(program: Program, text: str, spend: Callable[[int], None]) -> bool:
    """Whether ``re.search`` finds the program's pattern in ``text``; ``spend`` is charged each step
    (at most the program's size per position, and once more per position)."""
    code = program.code
    current: list[int] = []
    for position in range(len(text) + 1):
        # Threads carried over, then a match starting here (re.search tries every start).
        seen: set[int] = set()
        consuming: list[int] = []
        stack = [*reversed(current), 0]
        spend(1 + len(stack))
        steps = 0
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            steps += 1
            instruction = code[pc]
            kind = instruction[0]
            if kind == "match":
                spend(steps)
                return True
            if kind == "char":
                consuming.append(pc)
            elif kind == "split":
                stack.extend((instruction[2], instruction[1]))
            elif kind == "jmp":
                stack.append(instruction[1])
            elif _holds(instruction[1], text, position):
                stack.append(pc + 1)
        spend(steps)
        if position == len(text):
            break
        char = text[position]
        current = [pc + 1 for pc in consuming if code[pc][1].test(char)]
    return False


# The input left once an end assertion held: anything, "" or "\n", or "" only.
_ANY_REST, _EMPTY_OR_NEWLINE, _EMPTY = 0, 1, 2
_IDLE = -2  # no match started yet: re.search may start one at any later position
_DONE = -1  # the pattern has matched: whatever follows, the string is found
State = tuple[int, int]  # (instruction, _IDLE or _DONE; the input left)


def disjoint(first: Program, second: Program, spend: Callable[[int], None]) -> bool:
    """Whether no string is found by both patterns (``re.search``); False where not proven.

    A string found by both has a run of each automaton (from the start position ``re.search``
    found the match at to its end; idle before, done after); the pairs of runs are explored
    together, one character at a time, and a pair of character tests is followed unless they are
    shown to share no character. No pair reaching both matches: no string is found by both."""
    begin = {(0, _ANY_REST), (_IDLE, _ANY_REST)}
    start = (_closure(first, begin, True, spend), _closure(second, begin, True, spend))
    seen = {start}
    pending = [start]
    while pending:
        mine, theirs = pending.pop()
        spend(1 + len(mine) + len(theirs))
        if any(pc == _DONE for pc, _ in mine) and any(pc == _DONE for pc, _ in theirs):
            return False  # the string read so far, ended here, is found by both
        for left_test, left_next, left_rest in _moves(first, mine):
            for right_test, right_next, right_rest in _moves(second, theirs):
                spend(1)
                if not _may_share(left_test, left_rest, right_test, right_rest, spend):
                    continue
                step = (
                    _closure(first, {(left_next, _after(left_rest))}, False, spend),
                    _closure(second, {(right_next, _after(right_rest))}, False, spend),
                )
                if step not in seen:
                    seen.add(step)
                    pending.append(step)
    return True


_ANY_CHAR = CharTest(lambda char: True, None)


def _after(rest: int) -> int:
    """What the input left may be once a character is read: a newline ends what ``$`` allowed."""
    return _EMPTY if rest == _EMPTY_OR_NEWLINE else rest


def _may_share(
    first: CharTest, first_rest: int, second: CharTest, second_rest: int, spend: Callable[[int], None]
) -> bool:
    """Whether some character may be read by both tests, each within what its input left allows."""
    if _EMPTY in (first_rest, second_rest):
        return False
    if _EMPTY_OR_NEWLINE in (first_rest, second_rest):
        return first.test("\n") and second.test("\n")
    for finite, other in ((first.finite, second), (second.finite, first)):
        if finite is not None:
            spend(len(finite))
            return any(other.test(char) for char in finite)
    return True  # not shown apart (two categories, a negated class): taken to meet


def _moves(program: Program, states: frozenset[State]) -> list[tuple[CharTest, int, int]]:
    """(test, state after, input left) for each state that reads a character."""
    moves = []
    for pc, rest in states:
        if pc in (_IDLE, _DONE):
            moves.append((_ANY_CHAR, pc, rest))
        else:
            moves.append((program.code[pc][1], pc + 1, rest))
    return moves


def _closure(program: Program, states: set[State], at_start: bool, spend: Callable[[int], None]) -> frozenset[State]:
    """The states reached without reading a character (those that read one, idle, or done)."""
    code = program.code
    seen: set[State] = set()
    kept: set[State] = set()
    stack = list(states)
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        spend(1)
        pc, rest = state
        if pc == _IDLE:
            kept.add(state)
            stack.append((0, _ANY_REST))  # a match may start here
            continue
        if pc == _DONE:
            kept.add(state)
            continue
        instruction = code[pc]
        kind = instruction[0]
        if kind == "char":
            kept.add(state)
        elif kind == "match":
            stack.append((_DONE, rest))
        elif kind == "split":
            stack.extend(((instruction[1], rest), (instruction[2], rest)))
        elif kind == "jmp":
            stack.append((instruction[1], rest))
        elif instruction[1] == _BEGIN:
            if at_start:
                stack.append((pc + 1, rest))
        else:
            needed = _EMPTY_OR_NEWLINE if instruction[1] == _END else _EMPTY
            stack.append((pc + 1, max(rest, needed)))
    return frozenset(kept)
