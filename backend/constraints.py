"""llguidance in the logits post-processor: one matcher per request, masks for the batch at once.

:class:`GuidanceLogitsProcessor` keys its state by client id and masks a whole step at once:
:meth:`~GuidanceLogitsProcessor.mask` takes the step's ``[B, V]`` logits and each row's id,
has the rows' masks computed with llguidance's parallel API (GIL released) and applies them in
one launch. A matcher that fails gets an EOS-only mask, and the failure is kept for the scheduler
to end that request with an error.

The tokens reach the matchers ahead of the masks. The torch engine's step loop knows them
before its next forward pass and calls :meth:`~GuidanceLogitsProcessor.prefetch`: they are
consumed and the next masks computed while the forward pass runs, and ``mask`` only applies
them. The matchers live in a :class:`MaskSource`: :class:`ThreadedMatchers` computes on a worker
thread while the step loop delivers the tokens, or on the step loop's thread right after it queued
that pass (the scheduler's ``masks_on_loop_rows`` says when); ``backend.mask_process`` in a process
of its own, apart from the step loop's GIL. TensorRT-LLM's batched hook (one tensor and one whole
token list per request) adapts at its edge, ``backend/trtllm/hooks.py``, through
:meth:`~GuidanceLogitsProcessor.consume`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from llguidance import LLMatcher, LLTokenizer

from backend.cpu_cores import usable_cores
from backend.grammar_cache import GrammarCache, lanes_for
from backend.guidance_tokenizer import PlainTextTokenizer, guidance_tokenizers
from backend.mask_process import MaskProcess
from backend.masking import BitmaskApplier, CpuBitmaskApplier
from backend.matcher_table import Bitmask, FirstMask, MatcherTable
from llgtriton.guides import short

logger = logging.getLogger(__name__)


class PendingMasks(Protocol):
    def result(self) -> tuple[int, ...]:
        """Wait for a step's masks; the ids whose masks are in rows 0.., in row order."""
        ...


class MaskSource(Protocol):
    """Where the constrained requests' matchers live and their masks are computed."""

    @property
    def failures(self) -> Mapping[int, str]: ...

    def __contains__(self, client_id: object) -> bool: ...

    def __len__(self) -> int: ...

    def known(self, client_ids: Sequence[int | None]) -> list[int]: ...

    def add(
        self,
        client_id: int,
        matcher: LLMatcher,
        prompt_length: int,
        lane: int,
        *,
        grammar: str | None,
        first_mask: FirstMask | None = None,
    ) -> None: ...

    def remove(self, client_id: int) -> None: ...

    def fail(self, client_id: int, message: str) -> None: ...

    def prepare(self, grammar: str) -> Callable[[], None]: ...

    def start(
        self, client_ids: Sequence[int], tokens: Sequence[int], masks: Bitmask, *, on_worker: bool
    ) -> PendingMasks: ...

    def fill(self, client_ids: Sequence[int], masks: Bitmask, first: int) -> None: ...

    def is_accepting(self, client_id: int) -> bool: ...

    def consume(self, client_id: int, tokens: Sequence[int]) -> None: ...


def _nothing_to_wait_for() -> None:
    return None


class ThreadedMatchers(MatcherTable):
    """The matchers in this process: a step's masks computed on a worker thread, or on the caller's."""

    def __init__(self, tokenizer: LLTokenizer, mask_threads: int) -> None:
        super().__init__(tokenizer, mask_threads)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llgtriton-masks")

    def prepare(self, grammar: str) -> Callable[[], None]:
        return _nothing_to_wait_for  # the caller's GrammarCache compiled the matcher this table keeps

    def start(
        self, client_ids: Sequence[int], tokens: Sequence[int], masks: Bitmask, *, on_worker: bool
    ) -> PendingMasks:
        if on_worker:
            return self._worker.submit(self.advance, client_ids, tokens, masks)
        done: Future[tuple[int, ...]] = Future()  # a failure is kept for the caller, as the worker's would be
        try:
            done.set_result(self.advance(client_ids, tokens, masks))
        except Exception as exc:
            done.set_exception(exc)
        return done


@dataclass(frozen=True, eq=False)
class _Prefetch:
    """A step's masks being computed ahead: its requests, and when they are done."""

    members: frozenset[int]
    pending: PendingMasks


@dataclass(frozen=True)
class MaskedRows:
    """What :meth:`GuidanceLogitsProcessor.mask` masked: the step's constrained rows, in order, and with
    ``report_pressure`` each one's grammar pressure as the applier gives it."""

    rows: list[int]
    pressure: torch.Tensor | None = None


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
        source: MaskSource | None = None,
    ) -> None:
        """``plain_tokenizer`` is what :class:`GrammarCache` may compile grammars that never force a
        special token's spelling with. ``source`` holds the matchers (default: this process's threads)."""
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, logits have {vocab_size}")
        self._tokenizer = tokenizer
        self.plain_tokenizer = plain_tokenizer
        self.mask_threads = mask_threads or usable_cores()
        self.vocab_size = vocab_size
        self._source: MaskSource = source if source is not None else ThreadedMatchers(tokenizer, self.mask_threads)
        self._applier = applier or CpuBitmaskApplier(vocab_size, max_batch_size)
        self._prefetched: _Prefetch | None = None

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
        mask_process: bool = False,
        mask_processes: int = 1,
    ) -> GuidanceLogitsProcessor:
        """Build llguidance's tokenizers with the logits width and the engine's end-of-sequence tokens;
        with ``mask_process`` the matchers live in ``mask_processes`` processes of their own, which build
        their own (give them an applier whose host buffer is shared, ``bitmask_applier(..., shared=True)``,
        to spare a copy)."""
        tokenizers = guidance_tokenizers(hf_tokenizer, vocab_size, eos_token_ids)
        threads = mask_threads or usable_cores()
        source = None
        if mask_process:  # (into the applier's own buffer if it is shared: no copy a step)
            shared = applier.shared_masks() if applier is not None else None
            eos = tuple(eos_token_ids)
            source = MaskProcess(
                hf_tokenizer, vocab_size, eos, max_batch_size, threads, processes=mask_processes, shared=shared
            )
        return cls(
            tokenizers.text,
            vocab_size,
            max_batch_size,
            applier=applier,
            mask_threads=threads,
            plain_tokenizer=tokenizers.plain,
            source=source,
        )

    @property
    def tokenizer(self) -> LLTokenizer:
        return self._tokenizer

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
        """Constrain ``client_id`` with ``matcher``, a fresh copy of ``grammar`` (which a mask process
        compiles a copy of its own from); ``first_mask``, the grammar's first, spares computing it.
        Raises :class:`~backend.errors.Unavailable` if the matchers' process is down (it starts again)."""
        self._source.add(client_id, matcher, prompt_length, lane, grammar=grammar, first_mask=first_mask)

    def prepare(self, grammar: str) -> Callable[[], None]:
        """Start readying ``grammar`` where the masks are computed; the callable waits for it and raises
        :class:`~backend.errors.BackendError` if it cannot be. Call it while this process compiles its own."""
        return self._source.prepare(grammar)

    def remove(self, client_id: int) -> None:
        if self._prefetched is not None and client_id in self._prefetched.members:
            self._wait_for_prefetch()  # the worker may be using this request's matcher
        self._source.remove(client_id)

    def prefetch(self, client_ids: Sequence[int], tokens: Sequence[int], *, on_worker: bool = True) -> None:
        """Consume each request's newest token and compute the next masks: on the worker thread (or the
        mask process), or (``on_worker`` False) here, before returning."""
        self._wait_for_prefetch()
        if not len(self._source):
            return
        members = frozenset(self._source.known(client_ids))
        if members:
            masks = self._applier.host_masks(len(members)).numpy()
            self._prefetched = _Prefetch(members, self._source.start(client_ids, tokens, masks, on_worker=on_worker))

    def _wait_for_prefetch(self) -> tuple[int, ...]:
        """Wait for the worker; return the ids whose masks it left in rows 0.. of the buffer."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is None:
            return ()
        try:
            return prefetched.pending.result()
        except Exception as exc:  # the table records errors per request; this is a bug in the worker itself
            # Whether the worker consumed the tokens is unknown: a matcher that lags its request
            # would mask wrongly, so these requests may only end.
            logger.exception("computing masks ahead failed")
            for cid in prefetched.members:
                self._source.fail(cid, f"computing the token masks failed: {short(str(exc))}")
            return ()

    def error(self, client_id: int) -> str | None:
        return self._source.failures.get(client_id)

    @property
    def failures(self) -> Mapping[int, str]:
        """Why each failed request's constraint failed, by client id: usually empty, so a step checks
        its rows against it only when it is not."""
        return self._source.failures

    def is_accepting(self, client_id: int) -> bool:
        """Whether the tokens the request's matcher has consumed form a complete output."""
        if self._prefetched is not None and client_id in self._prefetched.members:
            self._wait_for_prefetch()  # (the worker may be consuming this request's token)
        return self._source.is_accepting(client_id)

    def consume(self, client_id: int, tokens: Sequence[int]) -> None:
        """Bring a request's matcher up to date with ``tokens``, the request's whole token list
        (TensorRT-LLM's shape); only the tokens it has not seen are read."""
        self._source.consume(client_id, tokens)

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
        source = self._source
        if not len(source):
            return None
        constrained = [(row, cid) for row, cid in enumerate(client_ids) if cid is not None and cid in source]
        if not constrained:
            return None
        rows = [row for row, _ in constrained]
        ids = [cid for _, cid in constrained]
        # Rows the worker already computed, as far as they are the same requests in the same order, are
        # reused (one that ended on a stop string meanwhile shifts the rest: those are computed again).
        done = 0
        while done < len(ready) and done < len(ids) and ids[done] == ready[done]:
            done += 1
        masks = self._applier.host_masks(len(rows))
        if done < len(ids):
            source.fill(ids[done:], masks.numpy(), done)
        if not isinstance(logits, torch.Tensor):
            if report_pressure:
                raise ValueError("the grammar's pressure is reported for one tensor's rows only")
            self._applier.apply([logits[row] for row in rows], stream_ptr)
            return MaskedRows(rows)
        chosen = None if len(rows) == logits.shape[0] else rows
        return MaskedRows(rows, self._applier.apply(logits, stream_ptr, rows=chosen, report_pressure=report_pressure))


@dataclass(frozen=True)
class Guidance:
    """What constrains an engine's rows: the logits post-processor and the grammars it compiles."""

    processor: GuidanceLogitsProcessor
    grammars: GrammarCache

    @classmethod
    def for_processor(cls, processor: GuidanceLogitsProcessor) -> Guidance:
        lanes = lanes_for(processor.mask_threads)
        return cls(processor, GrammarCache(processor.tokenizer, lanes=lanes, plain_tokenizer=processor.plain_tokenizer))
