"""llguidance's matchers in a process of their own: a step's tokens go in, its masks come back in shared memory.

In the engine's process the mask worker's calls into llguidance take the GIL back between calls
while the step loop delivers a step's tokens, and at 256 rows each waits 1 to 3 ms for it
(``docs/benchmarks.md``, issue 51). Here the matchers live in child processes with a GIL of their
own: :class:`MaskProcess` is the :class:`~backend.constraints.MaskSource` the engine's processor
talks to; each child (``backend.mask_child``) keeps one :class:`~backend.matcher_table.MatcherTable`
and one :class:`~backend.grammar_cache.GrammarCache` of its own; the messages between them are
``backend.mask_messages``.

- With several children each request is kept by one of them, and a step's rows are split among them:
  llguidance's threads in one process do not compute new states side by side, separate processes do
  (``bench/mask_scaling.py``). A request goes where its grammar is compiled already, unless that
  child has many more requests than the least busy one.

- Two socket pairs: ``steps`` carries the step loop's messages in order (a request's constraint,
  its end, a step's tokens, a fill) and the replies to the three that want one; ``compiles`` carries
  grammars to compile ahead of a request's admission, answered by key as each finishes.
- The masks come back in memory both map (``backend.shared_masks``): the applier's own pinned
  buffer when it shares it, so that nothing is copied; else a buffer of the child's, copied from.
- The child's tokenizers are built from the Hugging Face tokenizer, pickled, so their masks are
  the engine's own.
- If a child dies, every request it constrained ends with an error, the step loop goes on, and
  another child starts aside (constrained requests that arrive meanwhile for it are refused).
  The child exits when the engine's end of ``steps`` closes, so an engine that is killed leaves no
  orphan behind.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from llguidance import LLMatcher

from backend.errors import Unavailable, error_of_kind
from backend.mask_child_link import ChildLink, RowsReply
from backend.mask_messages import Accepting, Add, Advance, Compile, Consume, Fill, Remove, Spec
from backend.mask_placement import Placement
from backend.matcher_table import Bitmask, FirstMask, eos_only_mask, mask_words
from backend.shared_masks import SharedMasks, own_shared_masks

logger = logging.getLogger(__name__)


class _StepMasks:
    """A step's masks from every child that owns some of its rows (a :class:`~backend.constraints.PendingMasks`)."""

    def __init__(self, owner: MaskProcess, parts: Sequence[RowsReply], client_ids: tuple[int, ...]) -> None:
        self.owner = owner
        self.parts = parts
        self.client_ids = client_ids
        self._counted = False

    def result(self) -> tuple[int, ...]:
        for part in self.parts:
            self.owner.read_until(part)
        if not self._counted and self.parts:  # the children work side by side: the slowest one's time
            self._counted = True
            self.owner.compute_seconds += max(part.seconds for part in self.parts)
        return self.client_ids


class MaskProcess:
    """The engine's side of the mask processes (a :class:`~backend.constraints.MaskSource`).

    The step loop's calls (``add``, ``remove``, ``start``, ``fill``, ``is_accepting``, ``consume``)
    come from one thread at a time, as the processor makes them; ``prepare`` from the compile threads.
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        rows: int,
        mask_threads: int,
        *,
        processes: int = 1,
        shared: SharedMasks | None = None,
    ) -> None:
        """``mask_threads``: llguidance's threads in all, shared out among ``processes`` children.
        ``shared``: the applier's host buffer, which the children then write the masks into (else a
        buffer of their own, copied from)."""
        if processes < 1:
            raise ValueError(f"a mask process needs at least one child, not {processes}")
        words = mask_words(vocab_size)
        if shared is not None and (shared.rows < rows or shared.words != words):
            raise ValueError(f"the shared masks are {shared.rows} x {shared.words} words, not {rows} x {words}")
        self._own: SharedMasks | None = None  # masks of its own (closed with it), when the applier shares none
        if shared is None:
            shared = self._own = own_shared_masks(rows, words)
        self._shared = shared
        threads = max(1, mask_threads // processes)
        self._spec = lambda offset: Spec(hf_tokenizer, vocab_size, eos_token_ids, threads, rows, offset)
        self.eos_only = eos_only_mask(vocab_size, eos_token_ids)
        self._known: set[int] = set()
        self._owner: dict[int, ChildLink] = {}  # the child that keeps each request's matcher
        self._fresh: dict[int, FirstMask] = {}  # the first mask of requests that have consumed no token
        self.compute_seconds = 0.0  # the children's time consuming tokens and computing masks, all told
        self._failures: dict[int, str] = {}
        self._lost: dict[int, str] = {}  # failures this side decided (the child died): kept over replies
        self._consumed: set[int] = set()  # requests whose tokens came through consume(): replies may be older
        self._keys = itertools.count()
        self._placement: Placement[ChildLink] = Placement()
        self._lock = threading.Lock()  # starting a child, and the compiles waiting for it
        self._closed = False
        self._children = self._start(range(processes))

    def _start(self, indices: Sequence[int]) -> list[ChildLink]:
        """Children at ``indices``, started side by side."""
        children: list[ChildLink] = []
        try:
            for index in indices:
                children.append(ChildLink(index, self._spec, self._shared))
            for child in children:
                child.wait_ready()
        except BaseException:
            for child in children:
                child.process.kill()
                child.stop()
            raise
        for child in children:
            threading.Thread(
                target=self._read_compiles, args=(child,), name="llgtriton-mask-compiles", daemon=True
            ).start()
            logger.info("mask process %d ready", child.process.pid)
        return children

    @property
    def pid(self) -> int:
        """The first child's process id."""
        return self._children[0].process.pid

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(child.process.pid for child in self._children)

    @property
    def failures(self) -> Mapping[int, str]:
        return self._failures

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._known

    def __len__(self) -> int:
        return len(self._known)

    def known(self, client_ids: Sequence[int | None]) -> list[int]:
        known = self._known
        return [cid for cid in client_ids if cid is not None and cid in known]

    def add(
        self,
        client_id: int,
        matcher: LLMatcher,
        prompt_length: int,
        lane: int,
        *,
        grammar: str | None,
        first_mask: FirstMask | None = None,
    ) -> None:
        """``first_mask``: the grammar's first mask, which the request's first fill then writes here,
        with no round trip to the child. Raises :class:`Unavailable` while no child is up."""
        if grammar is None:
            raise ValueError("a mask process compiles its own matcher: it needs the grammar's text")
        placement = self._placement
        child = placement.claim(grammar)
        if child is None or not child.alive():
            child = placement.choose(self._children, grammar)
            if not child.alive():  # (another one starts aside; its grammars are compiled there again)
                self._died(child, EOFError("it exited"))
                raise Unavailable("the constraint's mask process is starting again; retry shortly")
            placement.count(child, 1)
            placement.place(grammar, child)
        self._known.add(client_id)
        self._owner[client_id] = child
        if first_mask is not None:
            self._fresh[client_id] = first_mask
        self._send(child, Add(client_id, grammar, prompt_length))  # (now: the child readies its matcher)

    def remove(self, client_id: int) -> None:
        self._known.discard(client_id)
        self._fresh.pop(client_id, None)
        self._failures.pop(client_id, None)
        self._lost.pop(client_id, None)
        self._consumed.discard(client_id)
        child = self._owner.pop(client_id, None)
        if child is not None:
            self._placement.count(child, -1)
            child.defer(Remove(client_id))

    def fail(self, client_id: int, message: str) -> None:
        if client_id in self._known and client_id not in self._failures:
            self._lost[client_id] = message
            self._failures[client_id] = message

    def start(self, client_ids: Sequence[int], tokens: Sequence[int], masks: Bitmask, *, on_worker: bool) -> _StepMasks:
        """Send the step's tokens; the children consume them and compute the masks whatever ``on_worker``.
        The masks go to rows 0.., the constrained requests' in step order."""
        fresh = self._fresh
        if fresh:
            for cid in client_ids:
                fresh.pop(cid, None)
        owner = self._owner
        ids: list[int] = []
        shares: dict[ChildLink, tuple[list[int], list[int], list[int]]] = {}
        for cid, token in zip(client_ids, tokens, strict=True):
            child = owner.get(cid)
            if child is None:
                continue
            share = shares.get(child)
            if share is None:
                share = shares[child] = ([], [], [])
            share[0].append(cid)
            share[1].append(token)
            share[2].append(len(ids))
            ids.append(cid)
        parts = []
        for child, (their_ids, their_tokens, rows) in shares.items():
            their_rows = range(len(rows)) if len(shares) == 1 else rows
            reply = RowsReply(child, their_ids, masks, their_rows, self.eos_only)
            self._ask(Advance(their_ids, their_tokens, their_rows), reply)
            parts.append(reply)
        return _StepMasks(self, parts, tuple(ids))

    def fill(self, client_ids: Sequence[int], masks: Bitmask, first: int) -> None:
        """Rows that join a step start with their grammar's first mask, written here when every one of
        them has it (no round trip: the children's own copies start from the same mask); else their
        children fill them all."""
        fresh = self._fresh
        if all(cid in fresh for cid in client_ids):
            for row, cid in enumerate(client_ids, start=first):
                masks[row] = fresh[cid] if cid not in self._failures else self.eos_only
            return
        shares: dict[ChildLink, tuple[list[int], list[int]]] = {}
        for row, cid in enumerate(client_ids, start=first):
            child = self._owner.get(cid)
            if child is None:
                masks[row] = self.eos_only
                continue
            share = shares.setdefault(child, ([], []))
            share[0].append(cid)
            share[1].append(row)
        parts = []
        for child, (their_ids, rows) in shares.items():
            reply = RowsReply(child, their_ids, masks, rows, self.eos_only)
            self._ask(Fill(their_ids, rows), reply)
            parts.append(reply)
        _StepMasks(self, parts, tuple(client_ids)).result()

    def is_accepting(self, client_id: int) -> bool:
        """From the child's last reply when it covers every token the request has consumed (an end
        token's step, which left the request out of its tokens); else asked, once its replies are in."""
        if client_id not in self._known or client_id in self._failures:
            return False
        child = self._owner[client_id]
        if client_id not in self._consumed and not any(client_id in reply.client_ids for reply in child.awaiting):
            for reply in reversed(child.answered):
                if client_id in reply.client_ids:
                    return client_id in reply.accepting
        while child.awaiting:
            self.read_until(child.awaiting[-1])
        try:
            child.post(Accepting(client_id))
            return bool(child.steps.recv())
        except (OSError, EOFError) as exc:
            self._died(child, exc)
            return False

    def consume(self, client_id: int, tokens: Sequence[int]) -> None:
        self._fresh.pop(client_id, None)  # (it may have consumed nothing new: the child fills it then)
        self._consumed.add(client_id)
        child = self._owner.get(client_id)
        if child is not None:
            self._send(child, Consume(client_id, list(tokens)))

    def prepare(self, grammar: str) -> Callable[[], None]:
        """Have a child compile ``grammar`` (a new child if one died), the one its request will go to;
        wait with the callable."""
        done: Future[None] = Future()
        key = next(self._keys)
        with self._lock:
            child: ChildLink | None = None
            try:
                self._replace_dead_children()
                child = self._placement.choose(self._children, grammar)
                self._placement.reserve(grammar, child)
                child.compiling[key] = done
                child.compiles.send(Compile(key, grammar))
            except Exception as exc:
                logger.warning("the mask process cannot take a grammar: %s", exc)
                if child is not None:
                    child.compiling.pop(key, None)
                done.set_exception(Unavailable(f"the constraint's mask process is down: {exc}"))

        def wait() -> None:
            try:
                done.result()
            except BaseException:  # no request comes for this compile
                if child is not None:
                    self._placement.release(grammar, child)
                raise

        return wait

    def _replace_dead_children(self) -> None:
        """Start another child for each that died (the lock held); the step loop fails the old ones' requests."""
        if self._closed:
            return
        dead = [child for child in self._children if not child.alive()]
        for child in dead:
            logger.warning("the mask process %d exited; starting another", child.process.pid)
            child.stop()
        if not dead:
            return
        self._placement.forget(child.index for child in dead)
        for new in self._start([child.index for child in dead]):
            self._children[new.index] = new

    def _restart(self) -> None:
        with self._lock:
            try:
                self._replace_dead_children()
            except Exception:  # the next prepare() tries again, and refuses its request meanwhile
                logger.exception("the mask process could not be started again")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for child in self._children:
                child.stop()
        if self._own is not None:
            os.close(self._own.fd)

    # -- the step loop's connections ----------------------------------------------------------

    def _send(self, child: ChildLink, message: object) -> None:
        try:
            child.post(message)
        except (OSError, EOFError) as exc:
            self._died(child, exc)

    def _ask(self, message: Advance | Fill, reply: RowsReply) -> None:
        """Send a request that wants masks back; a dead child's rows are EOS-only at once."""
        child = reply.child
        try:
            if not child.alive():
                raise EOFError("it exited")
            child.post(message)
            child.awaiting.append(reply)
        except (OSError, EOFError) as exc:
            self._died(child, exc)
            reply.end_only()

    def read_until(self, reply: RowsReply) -> None:
        """Read ``reply``'s child's answers in order until ``reply``'s is in."""
        child = reply.child
        while not reply.done:
            waiting = child.awaiting.popleft()
            try:
                masked = child.steps.recv()
            except (OSError, EOFError) as exc:
                waiting.end_only()
                self._died(child, exc)
                continue
            waiting.receive(masked)
            child.failures = masked.failures
            self._gather_failures()
            child.answered.append(waiting)

    def _gather_failures(self) -> None:
        if len(self._children) == 1:
            failures = dict(self._children[0].failures)
        else:
            failures = {}
            for child in self._children:
                failures.update(child.failures)
        failures.update(self._lost)
        self._failures = failures

    def _died(self, child: ChildLink, exc: BaseException) -> None:
        """``child`` is gone: every request it constrained fails, and another child starts."""
        owned = [cid for cid, keeper in self._owner.items() if keeper is child]
        if any(cid not in self._lost for cid in owned):
            logger.error("the mask process is gone (%s): its %d constrained requests end", exc, len(owned))
        for cid in owned:
            self.fail(cid, "the constraint's mask process exited")
        while child.awaiting:
            child.awaiting.popleft().end_only()
        if not child.broken:  # another child, started aside: requests whose grammar is cached here need one too
            child.broken = True
            threading.Thread(target=self._restart, name="llgtriton-mask-restart", daemon=True).start()

    # -- the compile threads' connection ------------------------------------------------------

    def _read_compiles(self, child: ChildLink) -> None:
        while True:
            try:
                compiled = child.compiles.recv()
            except (OSError, EOFError):
                break
            with self._lock:
                done = child.compiling.pop(compiled.key, None)
            if done is not None:
                if compiled.error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error_of_kind(*compiled.error))
        with self._lock:  # what the child still owed
            owed, child.compiling = list(child.compiling.values()), {}
        for done in owed:
            done.set_exception(Unavailable("the constraint's mask process exited"))
