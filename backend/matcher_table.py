"""The constrained requests' llguidance matchers, by client id, and their masks computed a batch at once.

:class:`MatcherTable` is the part of the logits post-processor that touches llguidance and nothing
else (no torch, no device): it advances the matchers by a step's tokens and writes their next masks
into rows of a numpy bitmask, with llguidance's parallel calls (GIL released). The processor runs it
on its worker thread or the step loop's (``backend.constraints``), or in a process of its own
(``backend.mask_process``), where it shares no GIL with the step loop.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import llguidance
import llguidance.numpy  # not llguidance.torch: importing it runs torch.compile (slow, and warns)
import numpy as np
import numpy.typing as npt
from llguidance import LLExecutor, LLMatcher, LLTokenizer

from llgtriton.guides import short

logger = logging.getLogger(__name__)

Bitmask = npt.NDArray[np.int32]  # [rows, words]: bit t of a row set where token t is allowed
FirstMask = npt.NDArray[np.int32]  # one row of it: the tokens a fresh copy of a grammar allows first


@dataclass(eq=False)
class _MatcherState:
    client_id: int
    matcher: LLMatcher
    consumed: int  # how many of the request's tokens (prompt included) the matcher has seen
    lane: int = 0  # its template's lane: the parallel calls take rows lane by lane
    error: str | None = None
    first_mask: FirstMask | None = None  # its grammar's first mask, until it consumes a token


def mask_words(vocab_size: int) -> int:
    """32-bit words in one row of a vocabulary's bitmask."""
    return (vocab_size + 31) // 32


def eos_only_mask(vocab_size: int, eos_tokens: Sequence[int]) -> Bitmask:
    """One bitmask row that allows only the end-of-sequence tokens: what a failed request may emit."""
    row = np.zeros(mask_words(vocab_size), dtype=np.uint32)
    for token in eos_tokens:
        row[token >> 5] |= np.uint32(1 << (token & 31))
    return row.view(np.int32)


def _by_lane(states: Sequence[_MatcherState]) -> list[int]:
    """Indices of ``states`` ordered by lane: llguidance splits its list into runs, one run to a
    thread, and rows of one lane would wait for each other's lock."""
    return sorted(range(len(states)), key=lambda index: states[index].lane)


class MatcherTable:
    """One matcher per constrained request; a failed one gets an EOS-only mask and its reason is kept."""

    def __init__(self, tokenizer: LLTokenizer, mask_threads: int) -> None:
        self.tokenizer = tokenizer
        self._executor = LLExecutor(num_threads=mask_threads)
        self._states: dict[int, _MatcherState] = {}
        self._failures: dict[int, str] = {}  # client id -> why its constraint failed (usually empty)
        self.eos_only = eos_only_mask(tokenizer.vocab_size, tokenizer.eos_tokens)  # a failed request's mask

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def add(
        self,
        client_id: int,
        matcher: LLMatcher,
        prompt_length: int,
        lane: int = 0,
        *,
        grammar: str | None = None,
        first_mask: FirstMask | None = None,
    ) -> None:
        """``first_mask``: the mask a fresh copy of ``matcher``'s grammar starts with, which its first
        fill copies instead of computing. ``grammar`` (the text ``matcher`` was compiled from) is not
        needed here; a table in another process compiles its own copy from it."""
        self._states[client_id] = _MatcherState(client_id, matcher, prompt_length, lane, first_mask=first_mask)
        self._failures.pop(client_id, None)

    def remove(self, client_id: int) -> None:
        self._states.pop(client_id, None)
        self._failures.pop(client_id, None)

    @property
    def failures(self) -> Mapping[int, str]:
        """Why each failed request's constraint failed, by client id (usually empty)."""
        return self._failures

    def fail(self, client_id: int, message: str) -> None:
        """Record the first reason a request's constraint failed; the request may then only end."""
        state = self._states.get(client_id)
        if state is not None and state.error is None:
            state.error = message
            self._failures[client_id] = message

    def known(self, client_ids: Sequence[int | None]) -> list[int]:
        """Those of ``client_ids`` that have a matcher, in order."""
        states = self._states
        return [cid for cid in client_ids if cid is not None and cid in states]

    def advance(
        self, client_ids: Sequence[int], tokens: Sequence[int], masks: Bitmask, rows: Sequence[int] | None = None
    ) -> tuple[int, ...]:
        """Each known request consumes its token, and its next mask goes to a row of ``masks``: with
        ``rows``, request ``i``'s to ``rows[i]`` (EOS-only for an id without a matcher); else the known
        ones' to rows 0.. in order. Returns the ids whose masks were written, in row order."""
        found = self._states.get
        pairs: list[tuple[_MatcherState, int]] = []
        targets: Sequence[int]
        if rows is None:
            pairs = [(state, token) for cid, token in zip(client_ids, tokens, strict=True) if (state := found(cid))]
            targets = range(len(pairs))
        else:
            targets = []
            for cid, token, row in zip(client_ids, tokens, rows, strict=True):
                if (state := found(cid)) is None:
                    masks[row] = self.eos_only
                else:
                    pairs.append((state, token))
                    targets.append(row)
        if not pairs:
            return ()
        states = [state for state, _ in pairs]
        order = _by_lane(states)  # one order for both calls
        live = [index for index in order if states[index].error is None]
        for state in states:
            state.consumed += 1
            state.first_mask = None
        try:
            consumed = [(states[index].matcher, pairs[index][1]) for index in live]
            accepted = llguidance.numpy.consume_token_par(self._executor, consumed)
        except Exception as exc:
            # Which matchers consumed the token before the failure is unknown, and retrying could
            # consume it twice and let the output drift from the grammar: these requests end instead.
            logger.exception("consuming tokens in parallel failed")
            for index in live:
                self.fail(states[index].client_id, f"the constraint failed on a token: {exc}")
        else:
            for index, ok in zip(live, accepted, strict=True):
                if not ok:
                    state = states[index]
                    why = short(state.matcher.get_error())
                    self.fail(state.client_id, f"the constraint rejected a token: {why}")
        self._fill(states, masks, targets, order)
        return tuple(state.client_id for state in states)

    def fill(self, client_ids: Sequence[int], masks: Bitmask, first: int) -> None:
        """The next masks of ``client_ids`` into rows ``first``.. of ``masks``; EOS-only for an id
        without a matcher (a mask process started again since its request began)."""
        self.fill_rows(client_ids, masks, range(first, first + len(client_ids)))

    def fill_rows(self, client_ids: Sequence[int], masks: Bitmask, rows: Sequence[int]) -> None:
        """The next mask of ``client_ids[i]`` into row ``rows[i]`` of ``masks``, as :meth:`fill`."""
        found = self._states.get
        targets: list[int] = []
        states: list[_MatcherState] = []
        for row, cid in zip(rows, client_ids, strict=True):
            state = found(cid)
            if state is None:
                masks[row] = self.eos_only
            else:
                targets.append(row)
                states.append(state)
        self._fill(states, masks, targets, _by_lane(states))

    def _fill(self, states: Sequence[_MatcherState], masks: Bitmask, rows: Sequence[int], order: Sequence[int]) -> None:
        """The mask of ``states[i]`` into row ``rows[i]`` of ``masks``, computed in ``order`` (by lane), or
        copied where it is the grammar's first; EOS-only for failed matchers."""
        if any(state.first_mask is not None for state in states):
            for row, state in zip(rows, states, strict=True):
                if state.first_mask is not None:
                    masks[row] = state.first_mask if state.error is None else self.eos_only
            computed = [index for index in order if states[index].first_mask is None]  # (still by lane)
            states, rows = [states[index] for index in computed], [rows[index] for index in computed]
            order = range(len(computed))
        if not states:
            return
        try:
            targets = [(states[index].matcher, rows[index]) for index in order]
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, targets, masks)
        except Exception as exc:  # never fail the batch: every constrained row may only end
            logger.exception("computing token masks failed")
            for state in states:
                self.fail(state.client_id, f"computing the token mask failed: {short(str(exc))}")
        for row, state in zip(rows, states, strict=True):
            if state.error is None and state.matcher.is_error():  # llguidance then leaves an end-only mask
                why = short(state.matcher.get_error())
                self.fail(state.client_id, f"the constraint failed while computing the next mask: {why}")
            if state.error is not None:
                masks[row] = self.eos_only

    def accepting(self, client_ids: Sequence[int], masks: Bitmask, rows: Sequence[int]) -> tuple[int, ...]:
        """Those of ``client_ids`` whose mask (in row ``rows[i]``) allows an end token and whose matcher
        accepts the output so far: the ones an end token may end now."""
        if not client_ids:
            return ()
        index = np.asarray(rows)
        allowed = np.zeros(len(index), dtype=bool)
        for token in self.tokenizer.eos_tokens:
            allowed |= (masks[index, token >> 5] >> (token & 31)) & 1 != 0
        found = self._states.get
        return tuple(
            cid
            for cid, row_allows in zip(client_ids, allowed.tolist(), strict=True)
            if row_allows and (state := found(cid)) is not None and state.error is None and state.matcher.is_accepting()
        )

    def is_accepting(self, client_id: int) -> bool:
        """Whether the tokens the request's matcher has consumed form a complete output."""
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
        state.first_mask = None
        if not state.matcher.consume_tokens(list(new)):
            self.fail(client_id, f"the constraint rejected a token: {short(state.matcher.get_error())}")
