"""A Hugging Face checkpoint on TensorRT-LLM's LLM API (PyTorch backend), streamed request by request.

Every request becomes one ``LLM.generate_async(prompt_ids, SamplingParams(...), streaming=True)``,
iterated on this adapter's own asyncio loop thread (TensorRT-LLM binds a result's queue to the
loop it was created on). A request with a grammar or a logit bias carries a
:class:`RequestLogitsProcessor`. A poller aborts the requests whose clients went away.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from backend.contract import ResponseSink
from backend.errors import BackendError, Unavailable, Unsupported
from backend.requests import EngineRequest
from backend.telemetry import StepCounters
from backend.trtllm.hooks import RequestLogitsProcessor
from backend.trtllm.model_files import TrtllmModel
from backend.trtllm.runs import EngineFinish, Run, Runs

logger = logging.getLogger(__name__)

CANCEL_POLL_S = 0.1
_FINISHES: frozenset[str] = frozenset({"stop", "length", "timeout", "cancelled"})


def sampling_params(
    factory: Any, request: EngineRequest, model: TrtllmModel, processor: RequestLogitsProcessor | None
) -> Any:
    """``tensorrt_llm.SamplingParams`` for ``request`` (``factory`` is that class)."""
    sampling = request.sampling
    eos = sorted(model.eos_token_ids)
    return factory(
        end_id=eos[0],
        pad_id=model.pad_token_id if model.pad_token_id is not None else eos[0],
        stop_token_ids=eos[1:] or None,
        max_tokens=request.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k or None,
        seed=sampling.seed,
        presence_penalty=sampling.presence_penalty or None,
        frequency_penalty=sampling.frequency_penalty or None,
        detokenize=False,  # we detokenize, so stop strings and UTF-8 behave as on every engine
        logits_processor=processor,
        ignore_eos=request.ignore_eos,
    )


def check_supported(request: EngineRequest) -> None:
    if request.logprobs is not None or request.prompt_logprobs is not None:
        raise Unsupported("logprobs are not supported by the trtllm engine yet")
    if request.grammar_pressure:
        raise Unsupported("grammar_pressure is not reported by the trtllm engine yet")


class LlmApiRunner:
    def __init__(self, llm: Any, sampling_params_class: Any, model: TrtllmModel, *, max_waiting: int) -> None:
        self._llm = llm
        self._sampling_params_class = sampling_params_class
        self._model = model
        self._max_waiting = max_waiting
        self._runs = Runs(
            model.tokenizer, model.eos_token_ids, model.max_model_len, model.guidance_tokenizer, stop_engine=self._abort
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llgtriton-trtllm", daemon=True)
        self._stopping = False
        self.counters = StepCounters()  # steps run inside TensorRT-LLM; it has its own statistics

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._poll_cancellations(), self._loop)

    def load(self) -> tuple[int, int]:
        return len(self._runs), 0

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None:
        check_supported(request)
        if self._stopping:
            raise Unavailable("the backend is shutting down")
        if len(self._runs) >= self._max_waiting:
            raise Unavailable(f"{self._max_waiting} requests are in flight already; retry later")
        run = self._runs.open(request, sink, self._model.verifier(request.grammar))
        asyncio.run_coroutine_threadsafe(self._generate(run), self._loop)

    def _processor(self, request: EngineRequest) -> RequestLogitsProcessor | None:
        if request.grammar is None and not request.sampling.logit_bias:
            return None
        return RequestLogitsProcessor(
            grammar=request.grammar,
            logit_bias=request.sampling.logit_bias,
            tokenizer_dir=str(self._model.tokenizer_dir),
            eos_token_ids=tuple(sorted(self._model.eos_token_ids)),
            prompt_length=len(request.prompt_ids),
        )

    async def _generate(self, run: Run) -> None:
        request = run.request
        try:
            params = sampling_params(self._sampling_params_class, request, self._model, self._processor(request))
            result = self._llm.generate_async(list(request.prompt_ids), sampling_params=params, streaming=True)
            run.handle = result
            seen = 0
            async for output in result:
                completion = output.outputs[0]
                token_ids: Sequence[int] = completion.token_ids
                if not self._runs.tokens(run, token_ids[seen:]):
                    return
                seen = len(token_ids)
                if output.finished:
                    self._runs.engine_finished(run, self._finish_reason(completion.finish_reason))
                    return
            self._runs.fail(run, BackendError("TensorRT-LLM ended the stream without a final output"))
        except Exception as exc:  # one request's failure (bad parameters, an engine error) is its own
            logger.exception("request %s failed in TensorRT-LLM", request.request_id)
            self._runs.fail(run, BackendError(f"TensorRT-LLM: {exc}"))

    @staticmethod
    def _finish_reason(reason: str | None) -> EngineFinish:
        if reason in _FINISHES:
            return reason  # type: ignore[return-value]
        raise BackendError(f"TensorRT-LLM finished with an unexpected reason {reason!r}")

    def _abort(self, run: Run) -> None:
        if run.handle is not None:
            try:
                run.handle.abort()
            except Exception:
                logger.exception("aborting request %s failed", run.request.request_id)

    async def _poll_cancellations(self) -> None:
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            self._runs.cancel_abandoned()

    async def _cancel_tasks(self) -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def shutdown(self) -> None:
        self._stopping = True
        for run in self._runs.active():
            self._abort(run)
        self._runs.fail_all(Unavailable("the backend is shutting down"))
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._llm.shutdown()  # before the loop closes: the engine may still post the aborted requests' ends
        self._loop.close()
