"""An engine with no model, for measuring the layers above the engine (Triton, the proxy).

It runs steps the way the real engine does, with nothing to compute: each step gives every running
streamed request one token of a fixed word, as fast as one worker thread can send them (or no
faster than one step in ``synthetic_step_ms``), up to ``max_batch_size`` requests at once (the rest
wait in the queue). A request gets ``max_tokens`` (default 16) tokens and finishes by length; one
that is not streamed gets them in one response. Requests are checked and refused the way the real
service refuses them. It never loads a model or a tokenizer, so a benchmark through it measures
only framing, transport and serialisation: at 256 clients, the streamed tokens per second the
layers can carry.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from backend.contract import ResponseSink
from backend.errors import InvalidRequest, Unavailable
from backend.telemetry import StepCounters
from llgtriton.settings import EngineSettings
from llgtriton.wire import FinishReason, GenerationOutput, GenerationRequest

logger = logging.getLogger(__name__)

WORD = " token"
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class _Job:
    request: GenerationRequest
    sink: ResponseSink


@dataclass(eq=False)
class _Stream:
    """A running streamed request and how many of its tokens it has been sent."""

    job: _Job
    tokens: int
    prompt: int
    sent: int = 0


class SyntheticService:
    def __init__(self, settings: EngineSettings) -> None:
        self._max_queue_size = settings.max_queue_size
        self._max_batch_size = settings.max_batch_size
        self._step_seconds = settings.synthetic_step_ms / 1e3
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._running = 0
        self.step_counters = StepCounters()  # no steps: the metrics stay at zero
        self.reports_engine = True
        self._thread = threading.Thread(target=self._run, name="llgtriton-synthetic", daemon=True)
        self._thread.start()
        logger.info("ready: synthetic engine (no model), %r per token", WORD)

    def load(self) -> tuple[int, int]:
        return self._running, self._jobs.qsize()

    def submit(self, request: GenerationRequest, request_id: str, sink: ResponseSink) -> None:
        if request.max_tokens is not None and request.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {request.max_tokens}")
        if request.logprobs or request.prompt_logprobs:
            raise InvalidRequest("the synthetic engine has no model, so no logprobs")
        if self._jobs.qsize() >= self._max_queue_size:
            raise Unavailable(f"the request queue is full ({self._max_queue_size} waiting); retry later")
        self._jobs.put(_Job(request, sink))

    def health(self) -> None:
        if not self._thread.is_alive():
            raise Unavailable("the synthetic engine has stopped")

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        streams: list[_Stream] = []
        while self._admit(streams):
            step_ends = time.perf_counter() + self._step_seconds
            streams = [stream for stream in streams if self._step(stream)]
            self._running = len(streams)
            if (left := step_ends - time.perf_counter()) > 0:
                time.sleep(left)
        for stream in streams:  # shutting down: the running requests end with an error, not silence
            try:
                stream.job.sink.fail(Unavailable("the synthetic engine has stopped"))
            except Exception:
                logger.exception("a synthetic request could not be ended")

    def _admit(self, streams: list[_Stream]) -> bool:
        """Move waiting requests into ``streams`` up to the batch size (waiting for one when none
        runs); a request that is not streamed is answered whole here. False once shut down."""
        while len(streams) < self._max_batch_size:
            try:
                job = self._jobs.get(block=not streams)
            except queue.Empty:
                return True
            if job is None:
                return False
            request = job.request
            tokens = request.max_tokens or DEFAULT_MAX_TOKENS
            prompt = len((request.prompt or "").split()) + sum(len(m.content.split()) for m in request.messages or ())
            prompt += len(request.prompt_token_ids or ())
            if request.stream:
                streams.append(_Stream(job, tokens, prompt))
            else:
                self._send(job.sink, GenerationOutput(WORD * tokens, FinishReason.LENGTH, prompt, tokens), final=True)
        self._running = len(streams)
        return True

    def _step(self, stream: _Stream) -> bool:
        """One token to ``stream`` (or the end of a cancelled one); whether it runs on."""
        sink = stream.job.sink
        if sink.is_cancelled():
            self._send(sink, GenerationOutput("", None, stream.prompt, stream.sent), final=True)
            return False
        stream.sent += 1
        last = stream.sent == stream.tokens
        output = GenerationOutput(WORD, FinishReason.LENGTH if last else None, stream.prompt, stream.sent)
        return self._send(sink, output, final=last) and not last

    @staticmethod
    def _send(sink: ResponseSink, output: GenerationOutput, *, final: bool) -> bool:
        try:
            sink.send(output, final=final)
        except Exception:  # a sink that fails must not stop the others
            logger.exception("a synthetic generation failed")
            return False
        return True
