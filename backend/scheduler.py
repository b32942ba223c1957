"""The step loop: requests join and leave between steps; one decode forward pass per step.

Each step: drop cancelled requests, decode every running sequence in one batched forward pass,
prefill the requests admitted since the last step together, run each request's logits post-processor
(TensorRT-LLM's signature) on its logits row, sample, then detokenize, check stop conditions
and send responses. The constrained requests' masks are computed on a worker thread, started as
soon as a step's tokens are sampled: it runs while they are delivered, during the next step's
admissions and its forward pass. The loop runs on its own thread; ``submit`` only enqueues.

A constrained request whose grammar is not in the cache yet is compiled on a small thread pool
(llguidance releases the GIL) and joins the queue when it is ready: a burst of new schemas
never stalls the step loop, and they compile in parallel. Requests may therefore start in a
different order than they came; a grammar that fails to compile fails its own request.

Admission is bounded twice: at most ``max_batch_size`` sequences run, and the tokens they may
hold in the KV cache (prompt plus ``max_tokens`` each, reserved at admission) stay within
``max_kv_tokens``; requests wait in a queue of at most ``max_queue_size``, and a request that
finds it full is refused at once with :class:`Unavailable`, never dropped.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from llguidance import LLMatcher

from backend.constraints import Guidance
from backend.contract import ResponseSink, deliver, deliver_failure, is_cancelled
from backend.detokenizer import Decoder, fast_decoder
from backend.engine import Engine
from backend.errors import BackendError, InvalidRequest, Unavailable
from backend.grammar_cache import GrammarCopy
from backend.grammar_pressure import StepPressure
from backend.output_grammar import IncompleteOutput, OutputGrammar
from backend.output_stream import OutputStream, PressureTally
from backend.requests import EngineRequest
from backend.sampling import (
    apply_logit_bias,
    apply_penalties,
    make_generator,
    sample_token,
    token_logprobs,
)
from backend.telemetry import StepCounters
from llgtriton.wire import Alternative, FinishReason, GenerationOutput, PromptLogprobs, TokenLogprob

logger = logging.getLogger(__name__)
_NOTHING_REMOVED = (0.0, 0.0)  # the figures of a step the grammar did not mask
# Launched ahead, steps of up to this many constrained rows compute their masks on the step loop.
MASKS_ON_LOOP_ROWS = 64


@dataclass(eq=False, kw_only=True)
class _Sequence(OutputStream):
    """A running request's decoding state (owned by the loop thread)."""

    seq_id: int
    generator: torch.Generator
    argmax_only: bool = False  # greedy with no hook, bias, penalty or logprobs: its token is its row's argmax


@dataclass(frozen=True, eq=False)
class _Waiting:
    request: EngineRequest
    sink: ResponseSink
    grammar: GrammarCopy | None  # the request's own copy of its compiled grammar
    prompt_logprobs: PromptLogprobs | None = None  # its prompt scored, when it asked


@dataclass(frozen=True, eq=False)
class _Launched:
    """A decode pass queued ahead: its sequences, in the order of its logits' rows."""

    sequences: list[_Sequence]
    logits: torch.Tensor


def kv_tokens(request: EngineRequest) -> int:
    """KV-cache tokens a request may hold: reserved whole at admission, so a batch never outgrows it."""
    return len(request.prompt_ids) + request.max_tokens


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        decoder: Decoder,
        eos_token_ids: frozenset[int],
        *,
        max_batch_size: int,
        max_model_len: int,
        guidance: Guidance | None = None,
        max_queue_size: int = 1024,
        max_kv_tokens: int | None = None,
        compile_threads: int = 4,
        token_bytes: Callable[[int], bytes] | None = None,
        launch_ahead: bool = False,
        masks_on_loop_rows: int | None = None,
    ) -> None:
        """``token_bytes`` gives a token's exact bytes for logprobs (default: its decoded text).
        ``launch_ahead`` queues each step's decode pass as soon as its tokens are sampled, before they
        are delivered, so that the device runs it meanwhile (a request a stop string or a
        cancellation then ends has its row computed once for nothing).

        ``masks_on_loop_rows``: a step with at most this many constrained rows computes its next
        masks on the step loop's thread once the next pass is queued; a larger one hands them to
        the processor's worker before it queues that pass, and delivers its tokens meanwhile. Both
        then run under the pass; the worker's calls into llguidance wait for the GIL while the step
        loop delivers, and on the H200 it was the faster at 256 rows, the step loop at 64 (issue 51).
        Default: 64 when launched ahead, else 0 (the worker: the next pass is queued later)."""
        self.launch_ahead = launch_ahead
        default_rows = MASKS_ON_LOOP_ROWS if launch_ahead else 0
        self.masks_on_loop_rows = default_rows if masks_on_loop_rows is None else masks_on_loop_rows
        self._ahead: _Launched | None = None  # the decode pass queued by the last step (launch_ahead)
        self._engine = engine
        self._token_bytes = token_bytes or (lambda token: decoder.decode([token]).encode())
        self._guidance = guidance
        self._decoder = fast_decoder(decoder)
        self._eos = eos_token_ids
        self._max_batch_size = max_batch_size
        self._max_model_len = max_model_len
        self._max_queue_size = max_queue_size
        self._max_kv_tokens = max_kv_tokens or max_batch_size * max_model_len
        self._waiting: deque[_Waiting] = deque()
        self._compiler = ThreadPoolExecutor(max_workers=compile_threads, thread_name_prefix="llgtriton-compile")
        # A prompt is scored by a forward pass of its own, off the loop: one at a time, never stalling the steps.
        self._scorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llgtriton-score")
        self._compiling: dict[Future[None], ResponseSink] = {}  # requests being compiled or scored
        self._running: list[_Sequence] = []
        self._ids = itertools.count()
        self._wakeup = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="llgtriton-scheduler", daemon=True)
        self.counters = StepCounters()

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None:
        with self._wakeup:
            if self._stopping:
                raise Unavailable("the backend is shutting down")
            need = kv_tokens(request)
            if need > self._max_kv_tokens:  # it could never be admitted: refuse instead of blocking the queue
                raise InvalidRequest(
                    f"the request needs {need} tokens of KV cache ({len(request.prompt_ids)} prompt + "
                    f"{request.max_tokens} to generate); the engine's budget is {self._max_kv_tokens}"
                )
            if len(self._waiting) + len(self._compiling) >= self._max_queue_size:
                raise Unavailable(f"the request queue is full ({self._max_queue_size} waiting); retry later")
            grammar_copy = None
            if request.grammar is not None and self._guidance is not None:
                grammar_copy = self._guidance.grammars.cached_copy(request.grammar)
            compiling = request.grammar is not None and self._guidance is not None and grammar_copy is None
            if compiling or request.prompt_logprobs is not None:  # off the loop thread; it joins the queue when ready
                pool = self._compiler if compiling else self._scorer
                future = pool.submit(self._prepare_and_enqueue, request, sink, grammar_copy)
                self._compiling[future] = sink
                future.add_done_callback(self._compiled)
                return
            self._waiting.append(_Waiting(request, sink, grammar_copy))
            self._wakeup.notify()

    def _prepare_and_enqueue(
        self, request: EngineRequest, sink: ResponseSink, grammar_copy: GrammarCopy | None
    ) -> None:
        """Compile the request's grammar and score its prompt, as it needs, then queue it."""
        prompt_logprobs = None
        try:
            if grammar_copy is None and request.grammar is not None and self._guidance is not None:
                ready = self._guidance.processor.prepare(request.grammar)  # (a mask process compiles its own)
                grammar_copy = self._guidance.grammars.copy(request.grammar)
                ready()
        except Exception as exc:  # it fails this request only
            if not isinstance(exc, BackendError):
                logger.exception("compiling a grammar failed")
                exc = BackendError(f"compiling the constraint failed: {exc}")
            deliver_failure(sink, exc)
            return
        if request.prompt_logprobs is not None:
            try:
                with torch.inference_mode():
                    prompt_logprobs = self._score(request)
            except Exception as exc:  # scoring fails its own request, never the step
                logger.exception("scoring the prompt of request %s failed", request.request_id)
                deliver_failure(sink, BackendError(f"scoring the prompt failed: {exc}"))
                return
        if request.max_tokens == 0:  # scoring only: nothing to generate
            detokenizer, stop_filter = OutputStream.parts(request, self._decoder)
            stream = OutputStream(request, sink, detokenizer, stop_filter, prompt_logprobs=prompt_logprobs)
            deliver(sink, stream.output("", FinishReason.LENGTH), final=True)
            return
        with self._wakeup:
            if self._stopping:
                deliver_failure(sink, Unavailable("the backend is shutting down"))
                return
            self._waiting.append(_Waiting(request, sink, grammar_copy, prompt_logprobs))
            self._wakeup.notify()

    def _compiled(self, future: Future[None]) -> None:
        """The compile finished or was cancelled by shutdown (then its request fails here)."""
        with self._wakeup:
            sink = self._compiling.pop(future, None)
        if future.cancelled() and sink is not None:
            deliver_failure(sink, Unavailable("the backend is shutting down"))

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        self._compiler.shutdown(wait=False, cancel_futures=True)  # the cancelled ones fail in _compiled
        self._scorer.shutdown(wait=False, cancel_futures=True)
        if self._thread.ident is None:  # never started: no loop to fail the waiting requests
            self._fail_all(Unavailable("the backend is shutting down"))
        else:
            self._thread.join(timeout)

    def load(self) -> tuple[int, int]:
        """(running, waiting) request counts; waiting includes requests whose grammar is compiling."""
        return len(self._running), len(self._waiting) + len(self._compiling)

    # Loop thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._stopping and not self._waiting and not self._running:
                    self._wakeup.wait()
                if self._stopping:
                    break
                admitted: list[_Waiting] = []
                reserved = sum(kv_tokens(seq.request) for seq in self._running)
                while (
                    self._waiting
                    and len(self._running) + len(admitted) < self._max_batch_size
                    and reserved + kv_tokens(self._waiting[0].request) <= self._max_kv_tokens
                ):
                    admitted.append(self._waiting.popleft())
                    reserved += kv_tokens(admitted[-1].request)
            try:
                with torch.inference_mode():
                    self._step(admitted)
            except Exception as exc:  # an engine failure must not kill the loop
                logger.exception("step failed; failing the %d running requests", len(self._running))
                self._ahead = None
                for seq in list(self._running):
                    self._abort(seq, exc)
        self._fail_all(Unavailable("the backend is shutting down"))

    def _step(self, admitted: list[_Waiting]) -> None:
        for seq in list(self._running):
            if is_cancelled(seq.sink, seq.request.request_id):
                self._finish_cancelled(seq)
        step, parts = self._decoded()
        joined = [seq for seq in map(self._admit, admitted) if seq is not None]
        if joined:  # every prompt admitted this step, in as few forward passes as the engine can
            parts.append(
                self._engine.prefill([seq.seq_id for seq in joined], [seq.request.prompt_ids for seq in joined])
            )
            step.extend(joined)
        # One [rows, V] tensor for the step; decode and prefill meet only on the steps that admit.
        if not parts:
            return
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        asking = [(row, seq.pressure) for row, seq in enumerate(step) if seq.pressure is not None]  # usually none
        masking_started = time.perf_counter()
        constrained, pressure = self._constrain(step, logits, bool(asking))
        masking_seconds = time.perf_counter() - masking_started if constrained else 0.0
        sampled = self._sample(step, logits)
        # (Sampling read the tokens back, so the stream has written the figures; with nothing sampled,
        # every row ended and its tally is not read.)
        self._tally_pressure(asking, pressure if sampled else None)
        going_on = [(seq, token) for seq, token in sampled if not seq.ends_on(token, self._eos, self._max_model_len)]
        # A worker starts on the masks before the next pass is queued; masks computed on this thread
        # wait until it is (this step's constrained rows stand for the next step's).
        on_worker = constrained > self.masks_on_loop_rows
        if on_worker:
            self._compute_masks_ahead(going_on, on_worker=True)
        if self.launch_ahead:
            self._launch_ahead(going_on)
        if not on_worker:
            self._compute_masks_ahead(going_on, on_worker=False)
        for seq, token in sampled:
            self._advance(seq, token)
        self.counters.add_step(len(step), constrained, masking_seconds)

    def _decoded(self) -> tuple[list[_Sequence], list[torch.Tensor]]:
        """The running sequences' decode pass: the one the last step queued, its rows of requests that
        have ended since left out, or one queued now."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            decoding = [seq for seq in self._running if seq.generated]
            if not decoding:
                return [], []
            return decoding, [self._engine.decode([s.seq_id for s in decoding], [s.generated[-1] for s in decoding])]
        running = set(self._running)
        kept = [row for row, seq in enumerate(ahead.sequences) if seq in running]
        if not kept:
            return [], []
        if len(kept) == len(ahead.sequences):
            return ahead.sequences, [ahead.logits]
        rows = torch.tensor(kept, device=ahead.logits.device)
        return [ahead.sequences[row] for row in kept], [ahead.logits.index_select(0, rows)]

    def _launch_ahead(self, going_on: list[tuple[_Sequence, int]]) -> None:
        """Queue the next decode pass for the sequences that the step's tokens do not end."""
        if going_on:
            logits = self._engine.decode([seq.seq_id for seq, _ in going_on], [token for _, token in going_on])
            self._ahead = _Launched([seq for seq, _ in going_on], logits)

    @staticmethod
    def _tally_pressure(asking: list[tuple[int, PressureTally]], pressure: StepPressure | None) -> None:
        """Add the step to each asking request's tally (read back after sampling, which waited for the
        device anyway); a request without a grammar had nothing removed."""
        if not asking:
            return
        figures = pressure.values() if pressure is not None else []
        rows = pressure.rows if pressure is not None else []
        if [row for row, _ in asking] == rows:  # (usually: every constrained row asked, and only those)
            for (_, tally), figure in zip(asking, figures, strict=True):
                tally.add(figure)
            return
        by_row = dict(zip(rows, figures, strict=True))
        for row, tally in asking:
            tally.add(by_row.get(row, _NOTHING_REMOVED))

    def _compute_masks_ahead(self, going_on: list[tuple[_Sequence, int]], *, on_worker: bool) -> None:
        """Start the next masks: each constrained request that its token does not end consumes it, and
        its next mask is computed (on the processor's worker, or here).

        Called as soon as the step's tokens are known, before they are detokenized and delivered
        (at 256 rows that takes longer than the masks): the worker runs during that, the next
        step's admissions and its forward pass, and the loop waits for it only when it applies
        the masks. A request that its token ends (an end token, its length) is left out, so
        releasing it never waits for the worker; one a stop string ends is released after the
        worker is done with it.
        """
        if self._guidance is not None and going_on:  # (the processor leaves out the unconstrained)
            ids, tokens = [seq.seq_id for seq, _ in going_on], [token for _, token in going_on]
            self._guidance.processor.prefetch(ids, tokens, on_worker=on_worker)

    def _constrain(
        self, step: list[_Sequence], logits: torch.Tensor, report_pressure: bool
    ) -> tuple[int, StepPressure | None]:
        """Mask the step's constrained rows in one call; returns their count, and with ``report_pressure``
        their grammar's pressure."""
        if self._guidance is None:
            return 0, None
        ids = [seq.seq_id for seq in step]
        masked = self._guidance.processor.mask(logits, ids, self._engine.stream_ptr, report_pressure=report_pressure)
        if masked is None:
            return 0, None
        pressure = StepPressure(masked.rows, masked.pressure) if masked.pressure is not None else None
        return len(masked.rows), pressure

    def _admit(self, waiting: _Waiting) -> _Sequence | None:
        request, sink = waiting.request, waiting.sink
        if sink.is_cancelled():
            deliver(sink, GenerationOutput(text="", prompt_tokens=len(request.prompt_ids)), final=True)
            return None
        prompt_logprobs = waiting.prompt_logprobs
        seq_id = next(self._ids)
        detokenizer, stop_filter = OutputStream.parts(request, self._decoder)
        grammar = None
        if request.grammar is not None:
            if self._guidance is None:
                deliver_failure(sink, InvalidRequest("this engine has no constraint support"))
                return None
            assert waiting.grammar is not None  # submit() compiled it, or found it in the cache
            grammar = self._output_grammar(seq_id, request, waiting.grammar.matcher)
            copy, prompt_length = waiting.grammar, len(request.prompt_ids)
            try:
                self._guidance.processor.add(
                    seq_id, copy.matcher, prompt_length, copy.lane, grammar=request.grammar, first_mask=copy.first_mask
                )
            except Unavailable as exc:  # (a mask process starting again): this request only, before any output
                deliver_failure(sink, exc)
                return None
        seq = _Sequence(
            request,
            sink,
            detokenizer,
            stop_filter,
            prompt_logprobs=prompt_logprobs,
            grammar=grammar,
            seq_id=seq_id,
            generator=make_generator(request.sampling.seed, self._engine.device),
            argmax_only=request.sampling.greedy
            and request.logits_processor is None
            and not request.sampling.logit_bias
            and not request.sampling.penalised
            and request.logprobs is None,
        )
        self._running.append(seq)
        return seq

    def _output_grammar(self, seq_id: int, request: EngineRequest, matcher: LLMatcher) -> OutputGrammar:
        assert self._guidance is not None
        processor = self._guidance.processor
        tags = {self._decoder.decode([token], skip_special_tokens=False): token for token in request.kept_tokens}
        return OutputGrammar(
            lambda: processor.is_accepting(seq_id),
            matcher.deep_copy() if request.stop else None,
            processor.tokenizer,
            tags,
        )

    def _sample(self, step: list[_Sequence], logits: torch.Tensor) -> list[tuple[_Sequence, int]]:
        """A token for every row of ``logits`` whose request is still healthy, in row order.

        Each request's own hook, bias, penalties and seeded draw run on its row (a failure ends only
        that request); every greedy row is then decided by one argmax over the step, with one device
        round trip. A row that needs nothing else (:attr:`_Sequence.argmax_only`, nearly all of
        them when serving) costs no per-row tensor work.
        """
        failures = self._guidance.processor.failures if self._guidance is not None else {}
        kept: list[tuple[int, _Sequence]] = []
        drawn: dict[int, int] = {}  # row -> token, of the rows drawn from their own distribution
        reporting: dict[_Sequence, torch.Tensor] = {}  # rows whose request wants logprobs
        for row, seq in enumerate(step):
            request = seq.request
            if failures and seq.seq_id in failures:
                assert self._guidance is not None and request.grammar is not None
                self._guidance.grammars.evict(request.grammar)  # its copies share lexer state: compile afresh
                self._abort(seq, BackendError(failures[seq.seq_id]))
                continue
            if seq.argmax_only:
                kept.append((row, seq))
                continue
            try:
                row_logits = logits[row]
                if request.logits_processor is not None:
                    token_ids = [[*request.prompt_ids, *seq.generated]]  # a user hook gets a real list
                    view = row_logits.view(1, 1, -1)
                    request.logits_processor(seq.seq_id, view, token_ids, self._engine.stream_ptr, seq.seq_id)
                apply_logit_bias(row_logits, request.sampling.logit_bias)
                apply_penalties(row_logits, seq.generated, request.sampling)
                if request.logprobs is not None:
                    reporting[seq] = row_logits
                if not request.sampling.greedy:
                    drawn[row] = sample_token(row_logits, request.sampling, seq.generator)
                kept.append((row, seq))
            except Exception as exc:  # a failing hook fails its own request, never the batch
                if not isinstance(exc, BackendError):
                    logger.exception("logits post-processing failed for request %s", request.request_id)
                self._abort(seq, exc)
        if len(drawn) < len(kept):  # (the rows were changed in place: the argmax sees every hook and bias)
            best: list[int] = logits.argmax(dim=-1).tolist()
        sampled = [(seq, drawn[row] if row in drawn else best[row]) for row, seq in kept]
        for seq, token in sampled:
            if seq in reporting and not seq.is_end_token(token, self._eos):  # an end token is no output
                seq.logprobs.append(self._logprob(reporting[seq], token, seq.request.logprobs or 0))
        return sampled

    def _score(self, request: EngineRequest) -> PromptLogprobs:
        """The prompt's tokens scored by the model (each given the ones before it)."""
        prompt = request.prompt_ids
        scores = self._engine.score_prompt(prompt, request.prompt_logprobs or 0)
        rest = tuple(
            TokenLogprob(
                self._token_bytes(token),
                logprob,
                tuple(Alternative(self._token_bytes(t), value) for t, value in alternatives),
            )
            for token, logprob, alternatives in zip(prompt[1:], scores.logprobs, scores.alternatives, strict=True)
        )
        return PromptLogprobs(self._token_bytes(prompt[0]), rest)

    def _logprob(self, logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
        logprob, alternatives = token_logprobs(logits, token, top)
        return TokenLogprob(
            self._token_bytes(token),
            logprob,
            tuple(Alternative(self._token_bytes(t), value) for t, value in alternatives),
        )

    def _advance(self, seq: _Sequence, token: int) -> None:
        """Emit ``token``, the next token of ``seq``: detokenize, check stop conditions, respond."""
        try:
            final = seq.push(token, self._eos, self._max_model_len)
        except IncompleteOutput as exc:
            logger.error("request %s: %s", seq.request.request_id, exc)
            self._abort(seq, exc)
            return
        if final is not None:
            self._release(seq)
            deliver(seq.sink, final, final=True)

    def _finish_cancelled(self, seq: _Sequence) -> None:
        logger.info("request %s cancelled after %d tokens", seq.request.request_id, len(seq.generated))
        self._release(seq)
        deliver(seq.sink, seq.output(""), final=True)

    def _abort(self, seq: _Sequence, error: Exception) -> None:
        self._release(seq)
        deliver_failure(seq.sink, error)

    def _release(self, seq: _Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        self._engine.release(seq.seq_id)
        if self._guidance is not None:
            self._guidance.processor.remove(seq.seq_id)

    def _fail_all(self, error: Exception) -> None:
        with self._wakeup:
            pending = list(self._waiting)
            self._waiting.clear()
        for seq in list(self._running):
            self._abort(seq, error)
        for waiting in pending:
            deliver_failure(waiting.sink, error)
