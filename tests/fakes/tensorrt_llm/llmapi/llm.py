"""Fake of the LLM API (NVIDIA/TensorRT-LLM, 1.2 line): ``tensorrt_llm/llmapi/llm.py`` @4c05a748 (``LLM``,
``generate_async``) and ``tensorrt_llm/executor/result.py`` @a678b91a (``RequestOutput``, ``CompletionOutput``).

Mirrored behaviour: ``backend`` defaults to "pytorch"; unknown keyword arguments raise
``ValueError``; ``generate_async`` must be called on the thread that runs the event loop the result
is iterated on; a streamed result yields itself with cumulative ``token_ids``; ``finish_reason``
is 'stop' (end id or a stop token, which is not in ``token_ids``), 'length' or 'cancelled';
``abort()`` cancels. Logits processors are pickled before use, as the IPC to the worker process
does, and called as the PyTorch backend's ``_execute_logit_post_processors`` calls them:
``lp(req_id, logits_row.view(1, 1, V), [prompt + generated], None, None)`` with an internal
``req_id`` that starts at ``max_batch_size``.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from tensorrt_llm._toy import ToyModel, vocab_size_of
from tensorrt_llm.sampling_params import SamplingParams

_LLM_ARGS = frozenset(
    {
        "backend", "pipeline_parallel_size", "context_parallel_size", "max_batch_size", "max_input_len",
        "max_seq_len", "max_beam_width", "max_num_tokens", "kv_cache_config", "enable_chunked_prefill",
        "batched_logits_processor", "guided_decoding_backend", "stream_interval", "enable_tqdm",
    }
)  # fmt: skip


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:
    def __init__(self, request_id: int, prompt_token_ids: list[int], on_abort: Any) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise AssertionError("aqueue is None: generate_async was called outside the event loop's thread") from None
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(0)]
        self._done = False
        self._queue: asyncio.Queue[tuple[list[int], str | None]] = asyncio.Queue()
        self._on_abort = on_abort
        self._aborted = False

    @property
    def finished(self) -> bool:
        return self._done

    def _publish(self, tokens: list[int], finish_reason: str | None) -> None:  # engine thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (tokens, finish_reason))

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        tokens, finish_reason = await self._queue.get()
        self.outputs[0].token_ids.extend(tokens)
        if finish_reason is not None:
            self.outputs[0].finish_reason = finish_reason
            self._done = True
        return self

    def abort(self) -> None:
        self._aborted = True
        self._on_abort(self.request_id)

    def aborted(self) -> bool:
        return self._aborted


@dataclass(eq=False)
class _Active:
    output: RequestOutput
    tokens: list[int]
    params: SamplingParams
    processors: list[Any]
    internal_id: int
    generator: torch.Generator
    generated: int = 0
    cancelled: bool = False


class LLM:
    created: ClassVar[list[LLM]] = []  # for the tests (not in TensorRT-LLM): every instance, in order

    def __init__(
        self,
        model: str | Path,
        tokenizer: Any = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        for key in kwargs:
            if key not in _LLM_ARGS:
                raise ValueError(f"{type(self)} got invalid argument: {key}")
        if kwargs.get("backend", "pytorch") != "pytorch":
            raise ValueError("this fake mirrors the PyTorch backend only")
        self.args = {"model": model, "tokenizer": tokenizer, "tensor_parallel_size": tensor_parallel_size, **kwargs}
        LLM.created.append(self)
        self._model = ToyModel(vocab_size_of(model))
        self._client_ids = itertools.count()
        self._internal_ids = itertools.count(kwargs.get("max_batch_size") or 2048)
        self._active: dict[int, _Active] = {}
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        self.processor_calls = 0

    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> RequestOutput:
        params = sampling_params or SamplingParams()
        if params.end_id is None and self.args.get("tokenizer") is None:
            raise ValueError("tokenizer is required to reset end_id if it is None")
        prompt = list(inputs["prompt_token_ids"] if isinstance(inputs, dict) else inputs)
        output = RequestOutput(next(self._client_ids), prompt, self._abort)
        processors = params.logits_processor
        processors = [] if processors is None else processors if isinstance(processors, list) else [processors]
        active = _Active(
            output,
            list(prompt),
            params,
            [pickle.loads(pickle.dumps(processor)) for processor in processors],  # to the worker process
            next(self._internal_ids),
            torch.Generator().manual_seed(params.seed or 0),
        )
        with self._lock:
            self._active[output.request_id] = active
        return output

    def _abort(self, request_id: int) -> None:
        with self._lock:
            active = self._active.get(request_id)
            if active is not None:
                active.cancelled = True

    def _loop(self) -> None:
        while self._running:
            time.sleep(ToyModel.step_delay_s)
            with self._lock:
                batch = list(self._active.values())
            for active in batch:
                self._step(active)

    def _step(self, active: _Active) -> None:
        params, output = active.params, active.output
        if active.cancelled:
            self._finish(active, [], "cancelled")
            return
        logits = self._model.logits(active.tokens).view(1, 1, -1)
        for processor in active.processors:
            self.processor_calls += 1
            processor(active.internal_id, logits, [list(active.tokens)], None, None)
        token = ToyModel.sample(logits.view(-1), params.temperature, active.generator)
        # TensorRT-LLM's executor worker: end_id -1 and no stop words under ignore_eos
        stops = set() if params.ignore_eos else {params.end_id, *(params.stop_token_ids or [])}
        if token in stops:
            self._finish(active, [], "stop")
            return
        active.tokens.append(token)
        active.generated += 1
        if active.generated >= params.max_tokens:
            self._finish(active, [token], "length")
        else:
            output._publish([token], None)

    def _finish(self, active: _Active, tokens: list[int], reason: str) -> None:
        with self._lock:
            self._active.pop(active.output.request_id, None)
        active.output._publish(tokens, reason)

    def shutdown(self) -> None:
        self._running = False
        self._thread.join(5)
