"""An engine with no model, for measuring the layers above the engine (Triton, the proxy).

Every request gets ``max_tokens`` (default 16) tokens of one fixed word, as fast as one worker
thread can send them, streamed or whole, and counts as finished by length. Requests are checked
and refused the way the real service refuses them. It never loads a model or a tokenizer, so a
benchmark through it measures only framing, transport and serialisation.
"""

from __future__ import annotations

import logging
import queue
import threading
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


class SyntheticService:
    def __init__(self, settings: EngineSettings) -> None:
        self._max_queue_size = settings.max_queue_size
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self.step_counters = StepCounters()  # no steps: the metrics stay at zero
        self.reports_engine = True
        self._thread = threading.Thread(target=self._run, name="llgtriton-synthetic", daemon=True)
        self._thread.start()
        logger.info("ready: synthetic engine (no model), %r per token", WORD)

    def load(self) -> tuple[int, int]:
        return 0, self._jobs.qsize()

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
        while (job := self._jobs.get()) is not None:
            try:
                self._generate(job)
            except Exception:  # a sink that fails must not stop the others
                logger.exception("a synthetic generation failed")

    @staticmethod
    def _generate(job: _Job) -> None:
        request, sink = job.request, job.sink
        tokens = request.max_tokens or DEFAULT_MAX_TOKENS
        prompt = len((request.prompt or "").split()) + sum(len(m.content.split()) for m in request.messages or ())
        prompt += len(request.prompt_token_ids or ())
        if not request.stream:
            output = GenerationOutput(WORD * tokens, FinishReason.LENGTH, prompt, tokens)
            sink.send(output, final=True)
            return
        for count in range(1, tokens + 1):
            if sink.is_cancelled():
                sink.send(GenerationOutput("", None, prompt, count - 1), final=True)
                return
            finish = FinishReason.LENGTH if count == tokens else None
            sink.send(GenerationOutput(WORD, finish, prompt, count), final=count == tokens)
