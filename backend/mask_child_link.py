"""The engine's link to one mask process (``backend.mask_process``): it starts the child, sends it
messages without waiting, and keeps the replies it owes.

The child (``backend.mask_child``) is started with :mod:`subprocess`, not :mod:`multiprocessing`:
the engine core runs in a daemonic process, which multiprocessing does not let have children.
"""

from __future__ import annotations

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

from backend.interpreter import this_python
from backend.mask_messages import Masked, Spec
from backend.matcher_table import Bitmask
from backend.shared_masks import SharedMasks

START_TIMEOUT_S = 120.0


class ChildLink:
    """One running child process: its connections, the masks it writes, and the replies it owes.

    The step loop never waits for the child to read (:meth:`post`): a wave of requests joining at 256
    rows sends hundreds of kilobytes of grammars, more than the socket holds, while the child computes
    a step. What the socket does not take at once is left to a writer thread, and what follows it
    queues behind it, in order.
    """

    def __init__(self, index: int, spec_of: Callable[[int], Spec], shared: SharedMasks) -> None:
        """Start the child; :meth:`wait_ready` waits until it has built its tokenizers."""
        steps_here, steps_there = socket.socketpair()
        compiles_here, compiles_there = socket.socketpair()
        self.index = index  # its place among the children, which the one that replaces it takes
        self.load = 0  # the requests it keeps
        self.failures: Mapping[int, str] = {}  # as its last reply gave them
        self.awaiting: deque[RowsReply] = deque()
        self.answered: deque[RowsReply] = deque(maxlen=4)  # the latest replies in, newest last
        self.compiling: dict[int, Future[None]] = {}  # by key, the grammars sent to compile
        self.masks = shared.masks
        self.broken = False  # its step connection failed: it is replaced, whether or not it still runs
        self.write_failed = False  # the writer could not send (the child is gone)
        self._outgoing: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._queued = 0  # frames handed to the writer and not yet written
        self._queue_lock = threading.Lock()
        self._deferred: list[object] = []  # sent with the next post
        try:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(entry for entry in sys.path if entry))
            ends = (steps_there.fileno(), compiles_there.fileno(), shared.fd)
            command = [this_python(), "-c", "from backend.mask_child import main; main()", *map(str, ends)]
            self.process = subprocess.Popen(command, pass_fds=ends, env=env)
            self._socket = steps_here  # written to by post(); read through self.steps
            self.steps = Connection(os.dup(steps_here.fileno()))
            self.compiles = Connection(compiles_here.detach())
            self.steps.send(spec_of(shared.offset))
        except BaseException:
            steps_here.close()
            compiles_here.close()
            if hasattr(self, "steps"):
                self.steps.close()
            raise
        finally:
            steps_there.close()
            compiles_there.close()
        self._writer = threading.Thread(target=self._write, name="llgtriton-mask-writer", daemon=True)

    def wait_ready(self) -> None:
        """Wait for the child's word that it runs; stopped and raising if it gives another, or none."""
        try:
            if not self.steps.poll(START_TIMEOUT_S):
                raise RuntimeError(f"the mask process did not start within {START_TIMEOUT_S:.0f} s")
            ready = self.steps.recv()
            if ready != "ready":
                raise RuntimeError(f"the mask process could not start: {ready}")
        except BaseException:
            self.process.kill()
            self.stop()
            raise
        self._writer.start()

    def alive(self) -> bool:
        return not self.broken and not self.write_failed and self.process.poll() is None

    def defer(self, message: object) -> None:
        """Send ``message`` with the next :meth:`post`, in order: for what need not reach the child
        before its next step (a step's ending requests), one pickle and one write, not one each."""
        self._deferred.append(message)

    def post(self, message: object) -> None:
        """Send the deferred messages and ``message`` as far as the socket takes them now, the rest by
        the writer, in order; raises :class:`OSError` once a write has failed. (Framed as
        :class:`Connection` frames it, which the child reads with.)"""
        if self.write_failed:
            raise OSError("the mask process's socket failed")
        if self._deferred:
            self._deferred.append(message)
            message, self._deferred = self._deferred, []
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
        if self._writer.is_alive():
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


class RowsReply:
    """The masks of ``client_ids`` on their way back from ``child`` into ``rows`` of ``masks``
    (``end_only``'s if it dies)."""

    def __init__(
        self, child: ChildLink, client_ids: Sequence[int], masks: Bitmask, rows: Sequence[int], end_only: Bitmask
    ) -> None:
        self.child = child
        self.client_ids = client_ids
        self.masks = masks
        self.rows = rows
        self._end_only = end_only
        self.seconds = 0.0  # the child's time computing them
        self.accepting: tuple[int, ...] = ()  # those whose output so far is complete (Masked.accepting)
        self.done = False

    def receive(self, masked: Masked) -> None:
        if self.masks.ctypes.data != self.child.masks.ctypes.data:  # (the applier's buffer is not the shared one)
            rows = _index(self.rows)
            self.masks[rows] = self.child.masks[rows]
        self.seconds = masked.seconds
        self.accepting = masked.accepting
        self.done = True

    def end_only(self) -> None:
        """No answer is coming (the child died): these rows may only end."""
        self.masks[_index(self.rows)] = self._end_only
        self.done = True


def _index(rows: Sequence[int]) -> slice | list[int]:
    if isinstance(rows, range) and rows.step == 1:
        return slice(rows.start, rows.stop)
    return list(rows)
