"""Compiled grammars, kept and copied: each constrained request gets its own matcher of a compiled one.

:class:`GrammarCache` compiles a grammar once (off the request's path when it is new) and hands out
copies; a grammar in use by many requests gets more compiled templates ("lanes"), so that llguidance's
mask threads are not queued on one template's lock. No torch here: the mask process
(``backend.mask_process``) keeps a cache of its own.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import llguidance.numpy  # not llguidance.torch: importing it runs torch.compile (slow, and warns)
import numpy as np
from llguidance import LLMatcher, LLTokenizer

from backend.cpu_cores import usable_cores
from backend.errors import InvalidConstraint, Unavailable
from backend.guidance_tokenizer import PlainTextTokenizer
from backend.matcher_table import FirstMask
from llgtriton.guides import CompilerBusy, GuideError, llguidance_panics_refused, on_compile_thread, short

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GrammarCopy:
    """A request's own matcher for a compiled grammar, the lane (which compiled template) it copies,
    and the mask every fresh copy of the grammar starts with (None where it was not computed).

    Copies of one template share llguidance's lexer state and its lock: their masks are computed one
    at a time however many threads there are. Copies of different lanes do not wait for each other.
    """

    matcher: LLMatcher
    lane: int = 0
    first_mask: FirstMask | None = None


@dataclass(eq=False)
class _Compiled:
    templates: list[LLMatcher]  # one per lane; the first compiled on the request's path, the rest spare
    first_mask: FirstMask | None = None  # (a fresh copy's first mask depends on the grammar alone)
    handed_out: int = 0
    spare_pending: bool = False
    spares_given_up: bool = False  # a spare failed to compile: the grammar keeps the lanes it has


class GrammarCache:
    """Compiled grammars, least recently used first out; a request gets a copy of a compiled matcher.

    Bounded by count and by the bytes of the grammars kept (a compiled matcher grows with its
    grammar); grammars that failed are never kept. A grammar that requests keep using is compiled
    again in the background, up to ``lanes`` times, and its copies are handed out round robin, so
    that the mask threads are not queued on one template's lock. A grammar that can never force a
    special token's spelling is compiled against ``plain_tokenizer`` (llguidance's own, which
    tokenizes forced text without calling back into Python) when one is given.
    """

    def __init__(
        self,
        tokenizer: LLTokenizer,
        capacity: int = 256,
        max_bytes: int = 64 << 20,
        *,
        lanes: int = 1,
        plain_tokenizer: PlainTextTokenizer | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._capacity = capacity
        self._max_bytes = max_bytes
        self.lanes = lanes
        self.plain_tokenizer = plain_tokenizer
        self._compiled: OrderedDict[str, _Compiled] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._spares = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llgtriton-spare-compile")
        self.compilations = 0

    def cached_copy(self, grammar: str) -> GrammarCopy | None:
        """A fresh copy of ``grammar`` if it is compiled already, else None (nothing is compiled on this thread)."""
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is None:
                return None
            self._compiled.move_to_end(grammar)
            return self._hand_out(grammar, compiled)

    def cached_matcher(self, grammar: str) -> LLMatcher | None:
        cached = self.cached_copy(grammar)
        return None if cached is None else cached.matcher

    def copy(self, grammar: str) -> GrammarCopy:
        """A fresh copy of ``grammar``; raises :class:`InvalidConstraint` if it does not compile.

        A new grammar is tried on fresh copies before it is kept (:meth:`_probe`): limits that
        llguidance meets only while generating (more than 2,000 items in an Earley row, a lexer out
        of expressions) then refuse the request here, with the limit named, instead of mid-way.
        """
        cached = self.cached_copy(grammar)
        if cached is not None:
            return cached
        copy = self._compile_new(grammar, hand_out=True)
        assert copy is not None
        return copy

    def ready(self, grammar: str) -> None:
        """Have ``grammar`` compiled in the cache, handing out no copy (a mask process readies what its
        engine is about to add, so that a grammar one request uses gets no spare); raises as :meth:`copy`."""
        with self._lock:
            if grammar in self._compiled:
                self._compiled.move_to_end(grammar)
                return
        self._compile_new(grammar, hand_out=False)

    def _compile_new(self, grammar: str, *, hand_out: bool) -> GrammarCopy | None:
        """Compile and keep ``grammar``; with ``hand_out``, a copy of it (lane 0)."""
        try:
            template, first_mask = on_compile_thread(lambda: self._compile_probed(grammar))
        except GuideError as exc:
            raise InvalidConstraint(str(exc)) from None
        except CompilerBusy as exc:
            raise Unavailable(str(exc)) from None
        with self._lock:
            self.compilations += 1
            compiled = self._compiled.get(grammar)
            if compiled is None:
                compiled = self._compiled[grammar] = _Compiled([template], first_mask)
                self._bytes += len(grammar)
            else:
                compiled.templates[0] = template
                compiled.first_mask = first_mask
            while len(self._compiled) > self._capacity or (self._bytes > self._max_bytes and len(self._compiled) > 1):
                dropped, entry = self._compiled.popitem(last=False)
                self._bytes -= len(dropped) * len(entry.templates)
            if not hand_out:
                return None
            compiled.handed_out += 1
            return GrammarCopy(template.deep_copy(), 0, first_mask)

    def matcher(self, grammar: str) -> LLMatcher:
        return self.copy(grammar).matcher

    def _hand_out(self, grammar: str, compiled: _Compiled) -> GrammarCopy:
        """The next lane's copy; a grammar in use by more requests than it has lanes gets one more, compiled aside."""
        lanes = min(self.lanes, len(compiled.templates))
        lane = compiled.handed_out % lanes
        compiled.handed_out += 1
        spare_wanted = compiled.handed_out > 1 and len(compiled.templates) < self.lanes
        if spare_wanted and not (compiled.spare_pending or compiled.spares_given_up):
            compiled.spare_pending = True
            self._spares.submit(self._add_spare, grammar, compiled)
        return GrammarCopy(compiled.templates[lane].deep_copy(), lane, compiled.first_mask)

    def _add_spare(self, grammar: str, compiled: _Compiled) -> None:
        try:
            template: LLMatcher | None = on_compile_thread(lambda: self._compile(grammar))
        except Exception as exc:  # it compiled before (busy, or a timeout under load): only the spares are given up
            logger.info("a spare copy of a grammar was not compiled: %s", exc)
            template = None
        with self._lock:
            compiled.spare_pending = False
            compiled.spares_given_up = template is None
            if template is not None and self._compiled.get(grammar) is compiled:
                compiled.templates.append(template)
                self._bytes += len(grammar)

    def _compile(self, grammar: str) -> LLMatcher:
        plain = self.plain_tokenizer
        tokenizer = plain.tokenizer if plain is not None and plain.reads_plainly(grammar) else self._tokenizer
        with llguidance_panics_refused():
            template = LLMatcher(tokenizer, grammar, log_level=0)  # compiles with the GIL released
            if template.is_error():
                raise GuideError(f"the constraint does not compile: {short(template.get_error())}")
        return template

    def _compile_probed(self, grammar: str) -> tuple[LLMatcher, FirstMask]:
        template = self._compile(grammar)
        with llguidance_panics_refused():
            return template, self._probe(template)

    def _probe(self, template: LLMatcher) -> FirstMask:
        """Raise :class:`GuideError` if a fresh copy fails within its first two masks, or a second copy at its
        first; return a fresh copy's first mask (one row), which every request of the grammar starts with.

        llguidance meets some limits only while generating: a flat alternation of more than 2,000
        items overflows an Earley row after the first token, and a lexer out of expressions fails
        the copy after the one that exhausted the state all copies share.
        """
        mask = np.zeros((1, (self._tokenizer.vocab_size + 31) // 32), dtype=np.int32)
        first, second = template.deep_copy(), template.deep_copy()
        llguidance.numpy.fill_next_token_bitmask(first, mask, 0)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))
        token = next((int(t) for t in allowed if int(t) not in self._tokenizer.eos_tokens), None)
        if token is not None and not first.is_error() and first.consume_token(token):
            llguidance.numpy.fill_next_token_bitmask(first, mask, 0)
        llguidance.numpy.fill_next_token_bitmask(second, mask, 0)
        for probe in (first, second):
            if probe.is_error():
                raise GuideError(f"the constraint fails as generation starts: {short(probe.get_error())}")
        first_mask: FirstMask = mask[0].copy()  # (second's, computed last)
        first_mask.flags.writeable = False
        return first_mask

    def evict(self, grammar: str) -> None:
        """Forget ``grammar``: a copy of it failed, and copies share their template's lexer state."""
        with self._lock:
            compiled = self._compiled.pop(grammar, None)
            if compiled is not None:
                self._bytes -= len(grammar) * len(compiled.templates)

    def clear(self) -> None:
        """Forget every grammar (a benchmark switching tokenizers or lanes between runs)."""
        with self._lock:
            self._compiled.clear()
            self._bytes = 0


# More lanes than this only compile a shared grammar more often: llguidance's threads rarely exceed it.
_MAX_LANES = 16


def lanes_for(mask_threads: int | None = None) -> int:
    """How many lanes a grammar cache gives a grammar in use: one per mask thread (default: per usable core)."""
    return min(mask_threads or usable_cores(), _MAX_LANES)
