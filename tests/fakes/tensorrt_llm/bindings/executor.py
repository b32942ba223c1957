"""Fake of ``tensorrt_llm.bindings.executor`` (NVIDIA/TensorRT-LLM, 1.2 line; nanobind
``cpp/tensorrt_llm/nanobind/executor/{request,executor,executorConfig}.cpp`` @ac456dca/@f0c873f5/@c40f1157
and ``cpp/include/tensorrt_llm/executor/types.h`` @03961722).

Mirrored behaviour: keyword-only arguments where the bindings have them; ``Request`` and
``SamplingConfig`` names (``seed``, not ``random_seed``); an unknown ``logits_post_processor_name``
raises at enqueue; the batched post-processor is called once per step with every request that
named it, as ``(req_ids, [logits [1, 1, V]], [[prompt + generated]], stream_ptr: int, client_ids)``,
with ``V = vocab_size_padded`` (the vocabulary padded to a multiple of the engine's TP size);
an exception from it ends every active request with an error (``terminateActiveRequests``);
streamed results carry only the new tokens; the end id is not among them.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch

from tensorrt_llm._toy import ToyModel, logits_width_of, vocab_size_of


class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


@dataclass
class ParallelConfig:
    communication_type: CommunicationType = CommunicationType.MPI
    communication_mode: CommunicationMode = CommunicationMode.LEADER
    device_ids: list[int] | None = None
    participant_ids: list[int] | None = None
    orchestrator_config: Any = None
    num_nodes: int | None = None


@dataclass
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = None


@dataclass
class LogitsPostProcessorConfig:
    processor_map: dict[str, Any] | None = None
    processor_batched: Any = None
    replicate: bool = True


@dataclass(kw_only=True)
class ExecutorConfig:
    max_beam_width: int = 1
    kv_cache_config: KvCacheConfig = field(default_factory=KvCacheConfig)
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    parallel_config: ParallelConfig | None = None
    logits_post_processor_config: LogitsPostProcessorConfig | None = None
    gather_generation_logits: bool = False


class SamplingConfig:
    def __init__(
        self,
        beam_width: int = 1,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        top_p_min: float | None = None,
        top_p_reset_ids: int | None = None,
        top_p_decay: float | None = None,
        seed: int | None = None,
        temperature: float | None = None,
        min_tokens: int | None = None,
        beam_search_diversity_rate: float | None = None,
        repetition_penalty: float | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        length_penalty: float | None = None,
        early_stopping: int | None = None,
        no_repeat_ngram_size: int | None = None,
        num_return_sequences: int | None = None,
        min_p: float | None = None,
        beam_width_array: list[int] | None = None,
    ) -> None:
        self.beam_width = beam_width
        self.top_k, self.top_p, self.seed, self.temperature = top_k, top_p, seed, temperature
        self.presence_penalty, self.frequency_penalty = presence_penalty, frequency_penalty


class OutputConfig:
    def __init__(
        self,
        return_log_probs: bool | None = None,
        return_context_logits: bool | None = None,
        return_generation_logits: bool | None = None,
        exclude_input_from_output: bool | None = None,
        return_encoder_output: bool | None = None,
        return_perf_metrics: bool | None = None,
        additional_model_outputs: Any = None,
    ) -> None:
        self.exclude_input_from_output = bool(exclude_input_from_output)


class Request:
    BATCHED_POST_PROCESSOR_NAME: ClassVar[str] = "batched"

    def __init__(
        self,
        input_token_ids: list[int],
        max_tokens: int,
        *,
        streaming: bool = False,
        sampling_config: SamplingConfig | None = None,
        output_config: OutputConfig | None = None,
        end_id: int | None = None,
        pad_id: int | None = None,
        position_ids: list[int] | None = None,
        bad_words: list[list[int]] | None = None,
        stop_words: list[list[int]] | None = None,
        embedding_bias: torch.Tensor | None = None,
        logits_post_processor_name: str | None = None,
        logits_post_processor: Any = None,
        client_id: int | None = None,
        return_all_generated_tokens: bool = False,
        num_return_sequences: int = 1,
        **unmirrored: Any,
    ) -> None:
        self.input_token_ids = list(input_token_ids)
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        self.end_id, self.pad_id = end_id, pad_id
        self.stop_words = stop_words
        self.logits_post_processor_name = logits_post_processor_name
        self.client_id = client_id


@dataclass
class Result:
    is_final: bool
    output_token_ids: list[list[int]]
    finish_reasons: list[FinishReason]
    is_sequence_final: bool = False
    sequence_index: int = 0


class Response:
    def __init__(self, request_id: int, result: Result | str, client_id: int | None = None) -> None:
        self.request_id = request_id
        self.client_id = client_id
        self.error_msg = result if isinstance(result, str) else ""
        self.result = result if isinstance(result, Result) else None

    def has_error(self) -> bool:
        return bool(self.error_msg)


@dataclass(eq=False)
class _Active:
    request_id: int
    request: Request
    tokens: list[int]
    generator: torch.Generator
    generated: int = 0
    cancelled: bool = False


class Executor:
    def __init__(self, model_path: str | Path, model_type: ModelType, executor_config: ExecutorConfig) -> None:
        self._model = ToyModel(vocab_size_of(model_path), logits_width_of(model_path))
        self._config = executor_config
        self._ids = itertools.count(1)
        self._active: dict[int, _Active] = {}
        self._responses: list[Response] = []
        self._ready = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def enqueue_request(self, request: Request) -> int:
        name = request.logits_post_processor_name
        lpp = self._config.logits_post_processor_config
        if name is not None and not (name == Request.BATCHED_POST_PROCESSOR_NAME and lpp and lpp.processor_batched):
            raise RuntimeError(f"LogitsPostProcessor {name} not found.")
        request_id = next(self._ids)
        seed = request.sampling_config.seed or 0
        with self._ready:
            self._active[request_id] = _Active(
                request_id, request, list(request.input_token_ids), torch.Generator().manual_seed(seed)
            )
        return request_id

    def cancel_request(self, id: int) -> None:
        with self._ready:
            if id in self._active:
                self._active[id].cancelled = True

    def await_responses(self, timeout: timedelta | None = None) -> list[Response]:
        with self._ready:
            if not self._responses:
                self._ready.wait(None if timeout is None else timeout.total_seconds())
            responses, self._responses = self._responses, []
        return responses

    def _respond(self, response: Response) -> None:
        with self._ready:
            self._responses.append(response)
            self._ready.notify_all()

    def _loop(self) -> None:
        while self._running:
            time.sleep(ToyModel.step_delay_s)
            with self._ready:
                batch = list(self._active.values())
            self._step(batch)

    def _step(self, batch: list[_Active]) -> None:
        live: list[_Active] = []
        for active in batch:
            if active.cancelled:
                self._finish(active, [], FinishReason.CANCELLED)
            else:
                live.append(active)
        logits = {active.request_id: self._model.logits(active.tokens).view(1, 1, -1) for active in live}
        hooked = [a for a in live if a.request.logits_post_processor_name == Request.BATCHED_POST_PROCESSOR_NAME]
        if hooked:
            assert self._config.logits_post_processor_config is not None
            try:
                self._config.logits_post_processor_config.processor_batched(
                    [a.request_id for a in hooked],
                    [logits[a.request_id] for a in hooked],
                    [[list(a.tokens)] for a in hooked],
                    0,
                    [a.request.client_id for a in hooked],
                )
            except Exception as exc:
                for active in live:
                    self._fail(active, f"Encountered an error in forwardAsync function: {exc}")
                return
        for active in live:
            self._advance(active, logits[active.request_id].view(-1))

    def _advance(self, active: _Active, logits: torch.Tensor) -> None:
        config = active.request.sampling_config
        # The sampling layers read only the first vocab_size logits: padding is never sampled.
        token = ToyModel.sample(logits[: self._model.vocab_size], config.temperature, active.generator)
        if token == active.request.end_id:
            self._finish(active, [], FinishReason.END_ID)
            return
        if [token] in (active.request.stop_words or []):
            self._finish(active, [], FinishReason.STOP_WORDS)
            return
        active.tokens.append(token)
        active.generated += 1
        if active.generated >= active.request.max_tokens:
            self._finish(active, [token], FinishReason.LENGTH)
        else:
            self._respond(
                Response(
                    active.request_id, Result(False, [[token]], [FinishReason.NOT_FINISHED]), active.request.client_id
                )
            )

    def _finish(self, active: _Active, tokens: list[int], reason: FinishReason) -> None:
        with self._ready:
            self._active.pop(active.request_id, None)
        self._respond(Response(active.request_id, Result(True, [tokens], [reason], True), active.request.client_id))

    def _fail(self, active: _Active, message: str) -> None:
        with self._ready:
            self._active.pop(active.request_id, None)
        self._respond(Response(active.request_id, message, active.request.client_id))

    def shutdown(self) -> None:
        self._running = False
        self._thread.join(5)
