"""The requests a TensorRT-LLM adapter has in flight, and what becomes of the tokens the engine returns.

Each :class:`Run` turns tokens into responses through the shared :class:`OutputStream` (our own
detokenizer, stop strings and length limit, so both engines answer alike) and checks every token
against its own copy of the request's grammar. That check is cheap (no masks) and makes the
constraint guarantee independent of where the post-processor ran: TensorRT-LLM may run it in a
worker process, where a failure cannot be reported back. A token the grammar does not allow, or
an end while the grammar is incomplete, ends the request with an error, never with bad output.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llguidance import LLMatcher, LLTokenizer

from backend.contract import ResponseSink, deliver, deliver_failure, is_cancelled
from backend.detokenizer import Decoder, fast_decoder
from backend.errors import BackendError, Unavailable
from backend.output_grammar import IncompleteOutput, OutputGrammar
from backend.output_stream import OutputStream
from backend.requests import EngineRequest
from llgtriton.wire import FinishReason, GenerationOutput

logger = logging.getLogger(__name__)

# How an engine said a request ended, in the LLM API's words (the executor's enum maps onto them).
EngineFinish = Literal["stop", "length", "timeout", "cancelled"]


@dataclass(eq=False, kw_only=True)
class Run(OutputStream):
    client_id: int
    verifier: LLMatcher | None  # the request's grammar, fed every token the engine returns
    handle: Any = None  # the engine's request: a RequestOutput (LLM API) or a request id (executor)
    done: bool = False


class Runs:
    def __init__(
        self,
        decoder: Decoder,
        eos_token_ids: Collection[int],
        max_model_len: int,
        guidance_tokenizer: LLTokenizer,
        *,
        stop_engine: Callable[[Run], None],
        release: Callable[[Run], None] = lambda run: None,
    ) -> None:
        """``stop_engine`` cancels a run the engine still works on; ``release`` frees what the adapter holds."""
        self._decoder = fast_decoder(decoder)
        self._guidance_tokenizer = guidance_tokenizer
        self._eos = frozenset(eos_token_ids)
        self._max_model_len = max_model_len
        self._stop_engine = stop_engine
        self._release = release
        self._runs: dict[int, Run] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open(self, request: EngineRequest, sink: ResponseSink, verifier: LLMatcher | None) -> Run:
        detokenizer, stop_filter = OutputStream.parts(request, self._decoder)
        grammar = None
        if verifier is not None:
            tags = {self._decoder.decode([token], skip_special_tokens=False): token for token in request.kept_tokens}
            pristine = verifier.deep_copy() if request.stop else None
            grammar = OutputGrammar(verifier.is_accepting, pristine, self._guidance_tokenizer, tags)
        run = Run(
            request, sink, detokenizer, stop_filter, grammar=grammar, client_id=next(self._ids), verifier=verifier
        )
        with self._lock:
            self._runs[run.client_id] = run
        return run

    def active(self) -> list[Run]:
        with self._lock:
            return list(self._runs.values())

    def __len__(self) -> int:
        return len(self._runs)

    def tokens(self, run: Run, tokens: Sequence[int]) -> bool:
        """Take the tokens the engine produced since its last output; False once the run is over."""
        for token in tokens:
            if run.done:
                break
            if run.verifier is not None and not run.verifier.consume_token(token):
                self._fail_running(run, f"the engine produced token {token}, which the constraint does not allow")
                break
            try:
                final = run.push(token, self._eos, self._max_model_len)
            except IncompleteOutput as exc:
                self._fail_running(run, str(exc))
                break
            if final is not None:
                self._stop_engine(run)  # a stop string or our length limit: the engine may not know yet
                self._close(run, final)
        return not run.done

    def engine_finished(self, run: Run, reason: EngineFinish) -> None:
        """The engine's last output for ``run`` has been taken; end the run as the engine says."""
        if run.done:
            return
        if reason == "cancelled":
            if is_cancelled(run.sink, run.request.request_id):
                self.cancelled(run)
            else:
                self.fail(run, Unavailable("the engine cancelled the request"))
        elif reason == "timeout":
            self.fail(run, BackendError("the engine timed out the request"))
        elif reason == "stop" and run.verifier is not None and not run.verifier.is_accepting():
            self.fail(run, BackendError("the engine ended the output before the constraint was complete"))
        else:
            finish = FinishReason.STOP if reason == "stop" else FinishReason.LENGTH
            self._close(run, run.final(finish, run.drain()))

    def cancelled(self, run: Run) -> None:
        logger.info("request %s cancelled after %d tokens", run.request.request_id, len(run.generated))
        self._close(run, run.output(""))

    def fail(self, run: Run, error: Exception) -> None:
        if self._finish(run):
            deliver_failure(run.sink, error)

    def _fail_running(self, run: Run, message: str) -> None:
        self._stop_engine(run)
        self.fail(run, BackendError(message))

    def _close(self, run: Run, final: GenerationOutput) -> None:
        if self._finish(run):
            deliver(run.sink, final, final=True)

    def _finish(self, run: Run) -> bool:
        """Mark ``run`` over and release it; False if it was over already."""
        with self._lock:
            if run.done:
                return False
            run.done = True
            self._runs.pop(run.client_id, None)
        try:
            self._release(run)
        except Exception:
            logger.exception("releasing request %s failed", run.request.request_id)
        return True

    def cancel_abandoned(self) -> None:
        """End the runs whose clients went away, and stop the engine working on them."""
        for run in self.active():
            if is_cancelled(run.sink, run.request.request_id):
                self._stop_engine(run)
                self.cancelled(run)

    def fail_all(self, error: Exception) -> None:
        for run in self.active():
            self.fail(run, error)
