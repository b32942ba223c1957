"""llguidance in the logits post-processor: one matcher per request, masks for the batch at once.

:class:`GuidanceLogitsProcessor` keys its state by client id and masks a whole step at once:
:meth:`~GuidanceLogitsProcessor.mask` takes the step's ``[B, V]`` logits and each row's id,
computes the rows' masks with llguidance's parallel API (GIL released) and applies them in one
launch. A matcher that fails gets an EOS-only mask, and the failure is kept for the scheduler
to end that request with an error.

The tokens reach the matchers ahead of the masks. The torch engine's step loop knows them
before its next forward pass and calls :meth:`~GuidanceLogitsProcessor.prefetch`: they are
consumed and the next masks computed while the forward pass runs, and ``mask`` only applies
them: on a worker thread while the step loop delivers the tokens, or on the step loop's thread
right after it queued that pass (the scheduler's ``masks_on_loop_rows`` says when). TensorRT-LLM's
batched hook (one tensor and one whole token list per request) adapts at its edge,
``backend/trtllm/hooks.py``, through :meth:`~GuidanceLogitsProcessor.consume`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.numpy  # not llguidance.torch: importing it runs torch.compile (slow, and warns)
import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer

from backend.cpu_cores import usable_cores
from backend.errors import InvalidConstraint, Unavailable
from backend.guidance_tokenizer import PlainTextTokenizer, guidance_tokenizers
from backend.masking import BitmaskApplier, CpuBitmaskApplier
from llgtriton.guides import CompilerBusy, GuideError, llguidance_panics_refused, on_compile_thread, short

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GrammarCopy:
    """A request's own matcher for a compiled grammar, and the lane (which compiled template) it copies.

    Copies of one template share llguidance's lexer state and its lock: their masks are computed one
    at a time however many threads there are. Copies of different lanes do not wait for each other.
    """

    matcher: LLMatcher
    lane: int = 0


@dataclass(eq=False)
class _Compiled:
    templates: list[LLMatcher]  # one per lane; the first compiled on the request's path, the rest spare
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
        try:
            template = on_compile_thread(lambda: self._compile(grammar, probe=True))
        except GuideError as exc:
            raise InvalidConstraint(str(exc)) from None
        except CompilerBusy as exc:
            raise Unavailable(str(exc)) from None
        with self._lock:
            self.compilations += 1
            compiled = self._compiled.get(grammar)
            if compiled is None:
                compiled = self._compiled[grammar] = _Compiled([template])
                self._bytes += len(grammar)
            else:
                compiled.templates[0] = template
            while len(self._compiled) > self._capacity or (self._bytes > self._max_bytes and len(self._compiled) > 1):
                dropped, entry = self._compiled.popitem(last=False)
                self._bytes -= len(dropped) * len(entry.templates)
            compiled.handed_out += 1
            return GrammarCopy(template.deep_copy(), 0)

    def matcher(self, grammar: str) -> LLMatcher:
        return self.copy(grammar).matcher

    def _hand_out(self, grammar: str, compiled: _Compiled) -> GrammarCopy:
        """The next lane's copy; a grammar in use by more requests than it has lanes gets one more, compiled aside."""
        lanes = min(self.lanes, len(compiled.templates))
        lane = compiled.handed_out % lanes
        compiled.handed_out += 1
        if len(compiled.templates) < self.lanes and not (compiled.spare_pending or compiled.spares_given_up):
            compiled.spare_pending = True
            self._spares.submit(self._add_spare, grammar, compiled)
        return GrammarCopy(compiled.templates[lane].deep_copy(), lane)

    def _add_spare(self, grammar: str, compiled: _Compiled) -> None:
        try:
            template: LLMatcher | None = on_compile_thread(lambda: self._compile(grammar, probe=False))
        except Exception as exc:  # it compiled before (busy, or a timeout under load): only the spares are given up
            logger.info("a spare copy of a grammar was not compiled: %s", exc)
            template = None
        with self._lock:
            compiled.spare_pending = False
            compiled.spares_given_up = template is None
            if template is not None and self._compiled.get(grammar) is compiled:
                compiled.templates.append(template)
                self._bytes += len(grammar)

    def _compile(self, grammar: str, *, probe: bool) -> LLMatcher:
        plain = self.plain_tokenizer
        tokenizer = plain.tokenizer if plain is not None and plain.reads_plainly(grammar) else self._tokenizer
        with llguidance_panics_refused():
            template = LLMatcher(tokenizer, grammar, log_level=0)  # compiles with the GIL released
            if template.is_error():
                raise GuideError(f"the constraint does not compile: {short(template.get_error())}")
            if probe:
                self._probe(template)
        return template

    def _probe(self, template: LLMatcher) -> None:
        """Raise :class:`GuideError` if a fresh copy fails within its first two masks, or a second copy at its first.

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


@dataclass(eq=False)
class _MatcherState:
    client_id: int
    matcher: LLMatcher
    consumed: int  # how many of the request's tokens (prompt included) the matcher has seen
    lane: int = 0  # its template's lane: the parallel calls take rows lane by lane
    error: str | None = None


@dataclass(frozen=True, eq=False)
class _Prefetch:
    """A step's masks computed ahead, by the worker or already on the step loop: its requests in row
    order (the masks' rows), the same as a set, and when they are done."""

    ids: tuple[int, ...]
    members: frozenset[int]
    done: Future[None]


@dataclass(frozen=True)
class MaskedRows:
    """What :meth:`GuidanceLogitsProcessor.mask` masked: the step's constrained rows, in order, and with
    ``report_pressure`` each one's grammar pressure as the applier gives it."""

    rows: list[int]
    pressure: torch.Tensor | None = None


# More lanes than this only compile a shared grammar more often: llguidance's threads rarely exceed it.
_MAX_LANES = 16


def lanes_for(mask_threads: int | None = None) -> int:
    """How many lanes a grammar cache gives a grammar in use: one per mask thread (default: per usable core)."""
    return min(mask_threads or usable_cores(), _MAX_LANES)


def _by_lane(states: Sequence[_MatcherState]) -> list[int]:
    """Indices of ``states`` ordered by lane: llguidance splits its list into runs, one run to a
    thread, and rows of one lane would wait for each other's lock."""
    return sorted(range(len(states)), key=lambda index: states[index].lane)


class GuidanceLogitsProcessor:
    def __init__(
        self,
        tokenizer: LLTokenizer,
        vocab_size: int,
        max_batch_size: int,
        *,
        applier: BitmaskApplier | None = None,
        mask_threads: int | None = None,
        plain_tokenizer: PlainTextTokenizer | None = None,
    ) -> None:
        """``plain_tokenizer`` is
        what :class:`GrammarCache` may compile grammars that never force a special token's spelling
        with."""
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, logits have {vocab_size}")
        self._tokenizer = tokenizer
        self.plain_tokenizer = plain_tokenizer
        self.mask_threads = mask_threads or usable_cores()
        self.vocab_size = vocab_size
        self._states: dict[int, _MatcherState] = {}
        self._failures: dict[int, str] = {}  # client id -> why its constraint failed (usually empty)
        self._executor = llguidance.LLExecutor(num_threads=mask_threads)
        self._applier = applier or CpuBitmaskApplier(vocab_size, max_batch_size)
        self._eos_only = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llgtriton-masks")
        self._prefetched: _Prefetch | None = None
        for token in tokenizer.eos_tokens:
            self._eos_only[token >> 5] |= 1 << (token & 31)

    @classmethod
    def for_tokenizer(
        cls,
        hf_tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Collection[int],
        max_batch_size: int,
        *,
        applier: BitmaskApplier | None = None,
        mask_threads: int | None = None,
    ) -> GuidanceLogitsProcessor:
        """Build llguidance's tokenizers with the logits width and the engine's end-of-sequence tokens."""
        tokenizers = guidance_tokenizers(hf_tokenizer, vocab_size, eos_token_ids)
        return cls(
            tokenizers.text,
            vocab_size,
            max_batch_size,
            applier=applier,
            mask_threads=mask_threads,
            plain_tokenizer=tokenizers.plain,
        )

    @property
    def tokenizer(self) -> LLTokenizer:
        return self._tokenizer

    def add(self, client_id: int, matcher: LLMatcher, prompt_length: int, lane: int = 0) -> None:
        self._states[client_id] = _MatcherState(client_id, matcher, consumed=prompt_length, lane=lane)
        self._failures.pop(client_id, None)

    def remove(self, client_id: int) -> None:
        if self._prefetched is not None and client_id in self._prefetched.members:
            self._wait_for_prefetch()  # the worker may be using this request's matcher
        self._states.pop(client_id, None)
        self._failures.pop(client_id, None)

    def _fail(self, state: _MatcherState, message: str) -> None:
        """Record the first reason ``state``'s constraint failed; the request may then only end."""
        if state.error is None:
            state.error = message
            self._failures[state.client_id] = message

    def prefetch(self, client_ids: Sequence[int], tokens: Sequence[int], *, on_worker: bool = True) -> None:
        """Consume each request's newest token and compute the next masks: on the worker thread, or
        (``on_worker`` False) here, before returning."""
        self._wait_for_prefetch()
        if not self._states:
            return
        found = self._states.get
        pairs = [(state, token) for cid, token in zip(client_ids, tokens, strict=True) if (state := found(cid))]
        if pairs:
            ids = tuple(state.client_id for state, _ in pairs)
            if on_worker:
                done = self._worker.submit(self._compute_ahead, pairs)
            else:  # computed now; a failure is kept for _wait_for_prefetch, as the worker's would be
                done = Future()
                try:
                    self._compute_ahead(pairs)
                    done.set_result(None)
                except Exception as exc:
                    done.set_exception(exc)
            self._prefetched = _Prefetch(ids, frozenset(ids), done)

    def _compute_ahead(self, pairs: list[tuple[_MatcherState, int]]) -> None:
        """Consume and compute in parallel, llguidance's calls with the GIL released."""
        states = [state for state, _ in pairs]
        order = _by_lane(states)  # one order for both calls
        live = [index for index in order if states[index].error is None]
        for state in states:
            state.consumed += 1
        try:
            consumed = [(states[index].matcher, pairs[index][1]) for index in live]
            accepted = llguidance.numpy.consume_token_par(self._executor, consumed)
        except Exception as exc:
            # Which matchers consumed the token before the failure is unknown, and retrying could
            # consume it twice and let the output drift from the grammar: these requests end instead.
            logger.exception("consuming tokens in parallel failed")
            for index in live:
                self._fail(states[index], f"the constraint failed on a token: {exc}")
        else:
            for index, ok in zip(live, accepted, strict=True):
                if not ok:
                    state = states[index]
                    self._fail(state, f"the constraint rejected a token: {short(state.matcher.get_error())}")
        self._fill(states, self._applier.host_masks(len(states)), 0, order)

    def _wait_for_prefetch(self) -> tuple[int, ...]:
        """Wait for the worker; return the ids whose masks it left in rows 0.. of the buffer."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is None:
            return ()
        try:
            prefetched.done.result()
        except Exception as exc:  # _fill records errors per request; this is a bug in the worker itself
            # Whether the worker consumed the tokens is unknown: a matcher that lags its request
            # would mask wrongly, so these requests may only end.
            logger.exception("computing masks ahead failed")
            for cid in prefetched.ids:
                state = self._states.get(cid)
                if state is not None:
                    self._fail(state, f"computing the token masks failed: {short(str(exc))}")
            return ()
        return prefetched.ids

    def error(self, client_id: int) -> str | None:
        return self._failures.get(client_id)

    @property
    def failures(self) -> Mapping[int, str]:
        """Why each failed request's constraint failed, by client id: usually empty, so a step checks
        its rows against it only when it is not."""
        return self._failures

    def is_accepting(self, client_id: int) -> bool:
        """Whether the tokens the request's matcher has consumed form a complete output."""
        if self._prefetched is not None and client_id in self._prefetched.members:
            self._wait_for_prefetch()  # (the worker may be consuming this request's token)
        state = self._states.get(client_id)
        return state is not None and state.error is None and state.matcher.is_accepting()

    def consume(self, client_id: int, tokens: Sequence[int]) -> None:
        """Bring a request's matcher up to date with ``tokens``, the request's whole token list
        (TensorRT-LLM's shape); only the tokens it has not seen are read."""
        state = self._states.get(client_id)
        if state is None:
            return
        new = tokens[state.consumed :]
        state.consumed = len(tokens)
        if state.error is not None or not new:
            return
        if not state.matcher.consume_tokens(list(new)):
            self._fail(state, f"the constraint rejected a token: {short(state.matcher.get_error())}")

    def mask(
        self,
        logits: torch.Tensor | Sequence[torch.Tensor],
        client_ids: Sequence[int | None],
        stream_ptr: int,
        *,
        report_pressure: bool = False,
    ) -> MaskedRows | None:
        """Mask each constrained row of a step with its request's next mask; None if no row is constrained.

        ``logits`` is the step's ``[B, V]`` tensor, or one tensor per request; row ``i`` belongs to
        ``client_ids[i]`` (None, or a request without a constraint: left alone). Every token a
        request sampled must have reached its matcher first, through :meth:`prefetch` or
        :meth:`consume`. Masks the worker computed ahead for these requests are used as they are.
        With ``report_pressure`` (one tensor only) its ``pressure`` holds each constrained row's
        :func:`~backend.grammar_pressure.pressure_of`, rows in step order, as the applier gives it
        (read it once the stream has passed the step, and before the next step's call, which may
        overwrite it).
        """
        ready = self._wait_for_prefetch()
        if not self._states:
            return None
        found = self._states.get
        constrained = [(row, state) for row, cid in enumerate(client_ids) if cid is not None and (state := found(cid))]
        if not constrained:
            return None
        rows = [row for row, _ in constrained]
        states = [state for _, state in constrained]
        # Rows the worker already computed, as far as they are the same requests in the same order, are
        # reused (one that ended on a stop string meanwhile shifts the rest: those are computed again).
        done = 0
        while done < len(ready) and done < len(states) and states[done].client_id == ready[done]:
            done += 1
        rest = states[done:]
        self._fill(rest, self._applier.host_masks(len(rows)), done, _by_lane(rest))
        if not isinstance(logits, torch.Tensor):
            if report_pressure:
                raise ValueError("the grammar's pressure is reported for one tensor's rows only")
            self._applier.apply([logits[row] for row in rows], stream_ptr)
            return MaskedRows(rows)
        chosen = None if len(rows) == logits.shape[0] else rows
        return MaskedRows(rows, self._applier.apply(logits, stream_ptr, rows=chosen, report_pressure=report_pressure))

    def _fill(self, states: Sequence[_MatcherState], masks: torch.Tensor, first: int, order: Sequence[int]) -> None:
        """Masks of ``states`` into rows ``first``.. of ``masks``, computed in ``order`` (by lane); EOS-only
        for failed matchers."""
        if not states:
            return
        try:
            targets = [(states[index].matcher, first + index) for index in order]
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, targets, masks.numpy())
        except Exception as exc:  # never fail the batch: every constrained row may only end
            logger.exception("computing token masks failed")
            for state in states:
                self._fail(state, f"computing the token mask failed: {short(str(exc))}")
        for index, state in enumerate(states):
            if state.error is None and state.matcher.is_error():  # llguidance then leaves an end-only mask
                why = short(state.matcher.get_error())
                self._fail(state, f"the constraint failed while computing the next mask: {why}")
            if state.error is not None:
                masks[first + index] = self._eos_only


@dataclass(frozen=True)
class Guidance:
    """What constrains an engine's rows: the logits post-processor and the grammars it compiles."""

    processor: GuidanceLogitsProcessor
    grammars: GrammarCache

    @classmethod
    def for_processor(cls, processor: GuidanceLogitsProcessor) -> Guidance:
        lanes = lanes_for(processor.mask_threads)
        return cls(processor, GrammarCache(processor.tokenizer, lanes=lanes, plain_tokenizer=processor.plain_tokenizer))
