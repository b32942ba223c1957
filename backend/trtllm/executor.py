"""A prebuilt TensorRT engine on TensorRT-LLM's executor (``tensorrt_llm.bindings.executor``).

One executor, configured with our batched logits post-processor (``replicate=False``: it runs
once, on the leader rank, with every constrained row of the step). Requests are enqueued with a
client id that keys their state in the post-processor, streamed, and cancelled through
``cancel_request``. One thread waits for responses, another polls for abandoned requests.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import torch

from backend.constraints import GuidanceLogitsProcessor
from backend.contract import ResponseSink
from backend.errors import BackendError, Unavailable
from backend.masking import bitmask_applier
from backend.requests import EngineRequest
from backend.telemetry import StepCounters
from backend.trtllm.hooks import BatchedHook
from backend.trtllm.llm_api import CANCEL_POLL_S, check_supported
from backend.trtllm.model_files import TrtllmModel
from backend.trtllm.runs import EngineFinish, Run, Runs
from llgtriton.settings import EngineSettings

logger = logging.getLogger(__name__)

AWAIT_TIMEOUT = timedelta(milliseconds=50)
_FINISHES: dict[str, EngineFinish] = {
    "END_ID": "stop",
    "STOP_WORDS": "stop",
    "LENGTH": "length",
    "TIMED_OUT": "timeout",
    "CANCELLED": "cancelled",
}


def executor_config(trtllm: Any, settings: EngineSettings, hook: BatchedHook) -> Any:
    parallel = None
    if settings.tensor_parallel_size * settings.pipeline_parallel_size > 1:
        parallel = trtllm.ParallelConfig(
            communication_type=trtllm.CommunicationType.MPI, communication_mode=trtllm.CommunicationMode.LEADER
        )
    return trtllm.ExecutorConfig(
        max_beam_width=1,
        kv_cache_config=trtllm.KvCacheConfig(free_gpu_memory_fraction=settings.kv_cache_memory_fraction),
        max_batch_size=settings.max_batch_size,
        parallel_config=parallel,
        logits_post_processor_config=trtllm.LogitsPostProcessorConfig(processor_batched=hook, replicate=False),
    )


def executor_request(trtllm: Any, request: EngineRequest, model: TrtllmModel, client_id: int, hooked: bool) -> Any:
    sampling = request.sampling
    eos = sorted(model.eos_token_ids)
    return trtllm.Request(
        list(request.prompt_ids),
        request.max_tokens,
        streaming=True,
        sampling_config=trtllm.SamplingConfig(
            1,
            top_k=sampling.top_k or None,
            top_p=sampling.top_p,
            seed=sampling.seed,
            temperature=sampling.temperature,
            presence_penalty=sampling.presence_penalty or None,
            frequency_penalty=sampling.frequency_penalty or None,
        ),
        output_config=trtllm.OutputConfig(exclude_input_from_output=True),
        end_id=-1 if request.ignore_eos else eos[0],  # -1: no end token, as TensorRT-LLM's LLM API sends it
        pad_id=model.pad_token_id if model.pad_token_id is not None else eos[0],
        stop_words=None if request.ignore_eos else [[token] for token in eos[1:]] or None,
        client_id=client_id,
        logits_post_processor_name=trtllm.Request.BATCHED_POST_PROCESSOR_NAME if hooked else None,
    )


class ExecutorRunner:
    def __init__(self, trtllm: Any, model: TrtllmModel, settings: EngineSettings) -> None:
        self._trtllm = trtllm
        self._model = model
        self._max_waiting = settings.max_batch_size + settings.max_queue_size
        device = torch.device(settings.device)
        processor = GuidanceLogitsProcessor(
            model.guidance_tokenizer,
            model.vocab_size,
            settings.max_batch_size,
            applier=bitmask_applier(device, model.vocab_size, settings.max_batch_size),
        )
        self._hook = BatchedHook(processor, sorted(model.eos_token_ids))
        self._runs = Runs(
            model.tokenizer,
            model.eos_token_ids,
            model.max_model_len,
            model.guidance_tokenizer,
            stop_engine=self._cancel,
            release=self._release,
        )
        self._executor = trtllm.Executor(
            model.model_dir, trtllm.ModelType.DECODER_ONLY, executor_config(trtllm, settings, self._hook)
        )
        self._by_request_id: dict[int, Run] = {}
        self._lock = threading.Lock()  # enqueueing and dispatching: a response never beats its request's record
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._await_loop, name="llgtriton-trtllm-responses", daemon=True),
            threading.Thread(target=self._cancel_loop, name="llgtriton-trtllm-cancel", daemon=True),
        ]
        self.counters = StepCounters()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def load(self) -> tuple[int, int]:
        return len(self._runs), 0

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None:
        check_supported(request)
        if self._stopping.is_set():
            raise Unavailable("the backend is shutting down")
        if len(self._runs) >= self._max_waiting:
            raise Unavailable(f"{self._max_waiting} requests are in flight already; retry later")
        run = self._runs.open(request, sink, self._model.verifier(request.grammar))
        masker = self._model.grammar_copy(request.grammar)  # the post-processor's own copy of the grammar
        if masker is not None:
            matcher, lane, first_mask = masker.matcher, masker.lane, masker.first_mask
            self._hook.processor.add(run.client_id, matcher, len(request.prompt_ids), lane, first_mask=first_mask)
        self._hook.add(run.client_id, request.sampling.logit_bias)
        hooked = request.grammar is not None or bool(request.sampling.logit_bias)
        try:
            with self._lock:
                run.handle = self._executor.enqueue_request(
                    executor_request(self._trtllm, request, self._model, run.client_id, hooked)
                )
                self._by_request_id[run.handle] = run
        except Exception as exc:
            self._runs.fail(run, BackendError(f"TensorRT-LLM refused the request: {exc}"))

    def _await_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                responses = self._executor.await_responses(timeout=AWAIT_TIMEOUT)
            except Exception:
                logger.exception("waiting for TensorRT-LLM responses failed")
                continue
            for response in responses:
                with self._lock:
                    run = self._by_request_id.get(response.request_id)
                if run is not None:
                    self._dispatch(run, response)

    def _dispatch(self, run: Run, response: Any) -> None:
        try:
            if response.has_error():
                self._runs.fail(run, BackendError(f"TensorRT-LLM: {response.error_msg}"))
                return
            constraint_error = self._hook.error(run.client_id)
            if constraint_error is not None:
                self._cancel(run)
                self._runs.fail(run, BackendError(constraint_error))
                return
            result = response.result
            if self._runs.tokens(run, result.output_token_ids[0]) and result.is_final:
                self._runs.engine_finished(run, _FINISHES.get(result.finish_reasons[0].name, "stop"))
        except Exception as exc:
            logger.exception("handling a TensorRT-LLM response failed")
            self._runs.fail(run, BackendError(f"handling the engine's output failed: {exc}"))

    def _cancel_loop(self) -> None:
        while not self._stopping.wait(CANCEL_POLL_S):
            self._runs.cancel_abandoned()

    def _cancel(self, run: Run) -> None:
        if run.handle is not None:
            try:
                self._executor.cancel_request(run.handle)
            except Exception:
                logger.exception("cancelling request %s failed", run.request.request_id)

    def _release(self, run: Run) -> None:
        with self._lock:
            self._by_request_id.pop(run.handle, None)
        self._hook.remove(run.client_id)

    def shutdown(self) -> None:
        self._stopping.set()
        for run in self._runs.active():
            self._cancel(run)
        self._runs.fail_all(Unavailable("the backend is shutting down"))
        for thread in self._threads:
            thread.join(10)
        self._executor.shutdown()
