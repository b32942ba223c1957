"""llguidance's matchers in a process of their own: a step's tokens go in, its masks come back in shared memory.

In the engine's process the mask worker's calls into llguidance take the GIL back between calls
while the step loop delivers a step's tokens, and at 256 rows each waits 1 to 3 ms for it
(``docs/benchmarks.md``, issue 51). Here the matchers live in a child process with a GIL of its own:
:class:`MaskProcess` is the :class:`~backend.constraints.MaskSource` the engine's processor talks
to; the child (``backend.mask_child``) keeps one :class:`~backend.matcher_table.MatcherTable` and one
:class:`~backend.grammar_cache.GrammarCache` of its own; the messages between them are
``backend.mask_messages``.

- Two socket pairs: ``steps`` carries the step loop's messages in order (a request's constraint,
  its end, a step's tokens, a fill) and the replies to the three that want one; ``compiles`` carries
  grammars to compile ahead of a request's admission, answered by key as each finishes.
- The masks come back in memory both map (``backend.shared_masks``): the applier's own pinned
  buffer when it shares it, so that nothing is copied; else a buffer of the child's, copied from.
- The child's tokenizers are built from the Hugging Face tokenizer, pickled, so their masks are
  the engine's own.
- If the child dies, every request it constrained ends with an error, the step loop goes on, and
  another child starts aside (constrained requests that arrive meanwhile end with an error too).
  The child exits when the engine's end of ``steps`` closes, so an engine that is killed leaves no
  orphan behind.

The child is started with :mod:`subprocess`, not :mod:`multiprocessing`: the engine core runs in a
daemonic process, which multiprocessing does not let have children.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import socket
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from llguidance import LLMatcher

from backend.errors import Unavailable, error_of_kind
from backend.interpreter import this_python
from backend.mask_messages import Accepting, Add, Advance, Compile, Consume, Fill, Masked, Remove, Spec
from backend.matcher_table import Bitmask, FirstMask, eos_only_mask, mask_words
from backend.shared_masks import SharedMasks, own_shared_masks

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0


def _shared_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


class _Child:
    """One running child process: its connections, the masks it writes, and the replies it owes.

    The step loop never waits for the child to read (:meth:`post`): a wave of requests joining at 256
    rows sends hundreds of kilobytes of grammars, more than the socket holds, while the child computes
    a step. What the socket does not take at once is left to a writer thread, and what follows it
    queues behind it, in order.
    """

    def __init__(self, spec_of: Callable[[int], Spec], shared: SharedMasks) -> None:
        steps_here, steps_there = socket.socketpair()
        compiles_here, compiles_there = socket.socketpair()
        self.awaiting: deque[_Reply] = deque()
        self.compiling: dict[int, Future[None]] = {}  # by key, the grammars sent to compile
        self.masks = shared.masks
        self.broken = False  # its step connection failed: it is replaced, whether or not it still runs
        self.write_failed = False  # the writer could not send (the child is gone)
        self._outgoing: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._queued = 0  # frames handed to the writer and not yet written
        self._queue_lock = threading.Lock()
        try:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(entry for entry in sys.path if entry))
            ends = (steps_there.fileno(), compiles_there.fileno(), shared.fd)
            command = [this_python(), "-c", "from backend.mask_child import main; main()", *map(str, ends)]
            self.process = subprocess.Popen(command, pass_fds=ends, env=env)
            self._socket = steps_here  # written to by post(); read through self.steps
            self.steps = Connection(os.dup(steps_here.fileno()))
            self.compiles = Connection(compiles_here.detach())
            self.steps.send(spec_of(shared.offset))
            if not self.steps.poll(START_TIMEOUT_S):
                self.process.kill()
                raise RuntimeError(f"the mask process did not start within {START_TIMEOUT_S:.0f} s")
            ready = self.steps.recv()
            if ready != "ready":
                raise RuntimeError(f"the mask process could not start: {ready}")
            self._writer = threading.Thread(target=self._write, name="llgtriton-mask-writer", daemon=True)
            self._writer.start()
        except BaseException:
            steps_here.close()
            compiles_here.close()
            if hasattr(self, "steps"):
                self.steps.close()
            raise
        finally:
            steps_there.close()
            compiles_there.close()

    def alive(self) -> bool:
        return not self.broken and not self.write_failed and self.process.poll() is None

    def post(self, message: object) -> None:
        """Send ``message`` as far as the socket takes it now, the rest by the writer, in order; raises
        :class:`OSError` once a write has failed. (Framed as :class:`Connection` frames it, which the
        child reads with.)"""
        if self.write_failed:
            raise OSError("the mask process's socket failed")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = struct.pack("!i", len(payload)) + payload
        with self._queue_lock:
            if not self._queued:
                try:
                    sent = self._socket.send(frame, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                if sent == len(frame):
                    return
                frame = frame[sent:]
            self._queued += 1
            self._outgoing.put(frame)

    def _write(self) -> None:
        while (frame := self._outgoing.get()) is not None:
            try:
                self._socket.sendall(frame)
            except OSError:  # the child is gone: the step loop finds out as it reads, or posts next
                self.write_failed = True
                return
            with self._queue_lock:
                self._queued -= 1

    def stop(self) -> None:
        self._outgoing.put(None)
        self._writer.join(1.0)
        if self._writer.is_alive():  # a child that does not read (stopped, stuck): the kill ends the write
            self.process.kill()
            self._writer.join(5.0)
        self.steps.close()
        self._socket.close()
        self.compiles.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


class _Reply:
    """A step's masks on their way back from ``child``: rows ``first``.. of ``masks`` once they are in."""

    def __init__(self, owner: MaskProcess, child: _Child, masks: Bitmask, first: int) -> None:
        self.owner = owner
        self.child = child
        self.masks = masks
        self.first = first
        self.client_ids: tuple[int, ...] | None = None

    def receive(self, masked: Masked) -> None:
        if self.masks.ctypes.data != self.child.masks.ctypes.data:  # (the applier's buffer is not the shared one)
            rows = slice(self.first, self.first + len(masked.client_ids))
            self.masks[rows] = self.child.masks[rows]
        self.client_ids = masked.client_ids

    def end_only(self, client_ids: Sequence[int]) -> None:
        """No answer is coming (the child died): these rows may only end."""
        self.masks[self.first : self.first + len(client_ids)] = self.owner.eos_only
        self.client_ids = tuple(client_ids)

    def result(self) -> tuple[int, ...]:
        self.owner.read_until(self)
        assert self.client_ids is not None
        return self.client_ids


class MaskProcess:
    """The engine's side of the mask process (a :class:`~backend.constraints.MaskSource`).

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
        shared: SharedMasks | None = None,
    ) -> None:
        """``shared``: the applier's host buffer, which the child then writes the masks into (else a
        buffer of its own, copied from)."""
        words = mask_words(vocab_size)
        if shared is not None and (shared.rows < rows or shared.words != words):
            raise ValueError(f"the shared masks are {shared.rows} x {shared.words} words, not {rows} x {words}")
        self._own: SharedMasks | None = None  # masks of its own (closed with it), when the applier shares none
        if shared is None:
            shared = self._own = own_shared_masks(rows, words)
        self._shared = shared
        self._spec = lambda offset: Spec(hf_tokenizer, vocab_size, eos_token_ids, mask_threads, rows, offset)
        self.eos_only = eos_only_mask(vocab_size, eos_token_ids)
        self._known: set[int] = set()
        self._fresh: dict[int, FirstMask] = {}  # the first mask of requests that have consumed no token
        self.compute_seconds = 0.0  # the children's time consuming tokens and computing masks, all told
        self._failures: dict[int, str] = {}
        self._lost: dict[int, str] = {}  # failures this side decided (the child died): kept over replies
        self._keys = itertools.count()
        self._lock = threading.Lock()  # starting a child, and the compiles waiting for it
        self._closed = False
        self._child = self._start()

    def _start(self) -> _Child:
        child = _Child(self._spec, self._shared)
        threading.Thread(target=self._read_compiles, args=(child,), name="llgtriton-mask-compiles", daemon=True).start()
        logger.info("mask process %d ready", child.process.pid)
        return child

    @property
    def pid(self) -> int:
        return self._child.process.pid

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
        with no round trip to the child. Raises :class:`Unavailable` while the child is down."""
        if grammar is None:
            raise ValueError("a mask process compiles its own matcher: it needs the grammar's text")
        child = self._child
        if not child.alive():  # (another one starts aside; its grammars are compiled there again)
            self._died(child, EOFError("it exited"))
            raise Unavailable("the constraint's mask process is starting again; retry shortly")
        self._known.add(client_id)
        if first_mask is not None:
            self._fresh[client_id] = first_mask
        self._send(Add(client_id, grammar, prompt_length))

    def remove(self, client_id: int) -> None:
        self._known.discard(client_id)
        self._fresh.pop(client_id, None)
        self._failures.pop(client_id, None)
        self._lost.pop(client_id, None)
        self._send(Remove(client_id))

    def fail(self, client_id: int, message: str) -> None:
        if client_id in self._known and client_id not in self._failures:
            self._lost[client_id] = message
            self._failures[client_id] = message

    def start(self, client_ids: Sequence[int], tokens: Sequence[int], masks: Bitmask, *, on_worker: bool) -> _Reply:
        """Send the step's tokens; the child consumes them and computes the masks whatever ``on_worker``."""
        fresh = self._fresh
        if fresh:
            for cid in client_ids:
                fresh.pop(cid, None)
        reply = _Reply(self, self._child, masks, 0)
        self._ask(Advance(list(client_ids), list(tokens)), reply, self.known(client_ids))
        return reply

    def fill(self, client_ids: Sequence[int], masks: Bitmask, first: int) -> None:
        """Rows that join a step start with their grammar's first mask, written here when every one of
        them has it (no round trip: the child's own copies start from the same mask); else the child
        fills them all."""
        fresh = self._fresh
        if all(cid in fresh for cid in client_ids):
            for row, cid in enumerate(client_ids, start=first):
                masks[row] = fresh[cid] if cid not in self._failures else self.eos_only
            return
        reply = _Reply(self, self._child, masks, first)
        self._ask(Fill(list(client_ids), first), reply, client_ids)
        reply.result()

    def is_accepting(self, client_id: int) -> bool:
        if client_id not in self._known or client_id in self._failures:
            return False
        child = self._child
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
        self._send(Consume(client_id, list(tokens)))

    def prepare(self, grammar: str) -> Callable[[], None]:
        """Have the child compile ``grammar`` (a new child if the last one died); wait with the callable."""
        done: Future[None] = Future()
        key = next(self._keys)
        with self._lock:
            try:
                self._replace_dead_child()
                self._child.compiling[key] = done
                self._child.compiles.send(Compile(key, grammar))
            except Exception as exc:
                logger.warning("the mask process cannot take a grammar: %s", exc)
                self._child.compiling.pop(key, None)
                done.set_exception(Unavailable(f"the constraint's mask process is down: {exc}"))

        def wait() -> None:
            done.result()

        return wait

    def _replace_dead_child(self) -> None:
        """Start another child if this one died (the lock held); the step loop fails the old one's requests."""
        if self._closed or self._child.alive():
            return
        logger.warning("the mask process %d exited; starting another", self._child.process.pid)
        self._child.stop()
        self._child = self._start()

    def _restart(self) -> None:
        with self._lock:
            try:
                self._replace_dead_child()
            except Exception:  # the next prepare() tries again, and refuses its request meanwhile
                logger.exception("the mask process could not be started again")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._child.stop()
        if self._own is not None:
            os.close(self._own.fd)

    # -- the step loop's connection -----------------------------------------------------------

    def _send(self, message: object) -> None:
        child = self._child
        try:
            child.post(message)
        except (OSError, EOFError) as exc:
            self._died(child, exc)

    def _ask(self, message: Advance | Fill, reply: _Reply, ids: Sequence[int]) -> None:
        """Send a request that wants masks back; a dead child's rows are EOS-only at once."""
        child = reply.child
        try:
            if not child.alive():
                raise EOFError("it exited")
            child.post(message)
            child.awaiting.append(reply)
        except (OSError, EOFError) as exc:
            self._died(child, exc)
            reply.end_only(ids)

    def read_until(self, reply: _Reply) -> None:
        """Read ``reply``'s child's answers in order until ``reply``'s is in."""
        child = reply.child
        while reply.client_ids is None:
            waiting = child.awaiting.popleft()
            try:
                masked = child.steps.recv()
            except (OSError, EOFError) as exc:
                waiting.end_only([])
                self._died(child, exc)
                continue
            waiting.receive(masked)
            self.compute_seconds += masked.seconds
            self._failures = dict(masked.failures)
            self._failures.update(self._lost)

    def _died(self, child: _Child, exc: BaseException) -> None:
        """``child`` is gone: every request it constrained fails, and another child starts."""
        if self._known - self._lost.keys():
            logger.error("the mask process is gone (%s): its %d constrained requests end", exc, len(self._known))
        for cid in self._known:
            self.fail(cid, "the constraint's mask process exited")
        while child.awaiting:
            child.awaiting.popleft().end_only([])
        if not child.broken:  # another child, started aside: requests whose grammar is cached here need one too
            child.broken = True
            threading.Thread(target=self._restart, name="llgtriton-mask-restart", daemon=True).start()

    # -- the compile threads' connection ------------------------------------------------------

    def _read_compiles(self, child: _Child) -> None:
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
